#include "tedsim/report/html_page.hpp"

#include "tedsim/report/vega_library.hpp"

#include <cstdlib>

namespace tedsim {
namespace {

const char* kStyle = R"(<style>
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px auto;max-width:1180px;color:#1d2330;padding:0 16px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #dde1e8;padding-bottom:4px}
h3{font-size:15px;margin-top:20px}p{line-height:1.45}
pre{background:#f5f6f8;padding:10px;white-space:pre-wrap;font-size:12px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #dde1e8;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f0f2f5;cursor:pointer;user-select:none}th:first-child,td:first-child,td.text{text-align:left}
tbody tr:nth-child(even){background:#fafbfc}
figure{margin:14px 0 22px 0}figcaption,.caption{font-size:12px;color:#4a5263;margin-top:4px}
</style>
)";

// Renders each plot, then records what was drawn. Runs after Vega is defined.
const char* kRuntime = R"(<script>
(function(){
  const status={plots:[],errors:[]};
  const note=(kind,args)=>status.errors.push(kind+': '+Array.from(args).map(String).join(' '));
  for(const level of ['error','warn','log','info']){const original=console[level];
    console[level]=function(){note('console.'+level,arguments);original.apply(console,arguments);};}
  window.addEventListener('error',e=>status.errors.push('error: '+e.message));
  window.addEventListener('unhandledrejection',e=>status.errors.push('unhandled rejection: '+String(e.reason)));
  function marksOf(mark){
    if(!mark||!mark.marktype)return 0;
    if(mark.marktype==='group'){let n=0;for(const g of mark.items||[])for(const child of g.items||[])n+=marksOf(child);return n;}
    return mark.role==='mark'?(mark.items||[]).length:0;
  }
  const pending=[];
  document.querySelectorAll('script[type="application/json"][data-plot]').forEach(node=>{
    const id=node.dataset.plot;
    try{
      const view=new vega.View(vega.parse(JSON.parse(node.textContent)),{renderer:'svg',container:'#'+id,hover:true});
      pending.push(view.runAsync().then(v=>status.plots.push({id:id,marks:marksOf(v.scenegraph().root)}),
                                        e=>{status.errors.push(id+': '+e);status.plots.push({id:id,marks:0});}));
    }catch(e){status.errors.push(id+': '+e);status.plots.push({id:id,marks:0});}
  });
  Promise.all(pending).then(()=>{
    status.height=document.documentElement.scrollHeight;
    document.documentElement.dataset.tedsimStatus=JSON.stringify(status);
    document.documentElement.dataset.tedsimDone='1';
  });
  document.querySelectorAll('table.sortable').forEach(table=>{
    table.querySelectorAll('th').forEach((th,col)=>th.addEventListener('click',()=>{
      const body=table.tBodies[0];const rows=Array.from(body.rows);
      const cell=r=>r.cells[col].textContent.trim();
      const numeric=rows.every(r=>cell(r)===''||!isNaN(parseFloat(cell(r))));
      const up=th.dataset.order!=='asc';th.dataset.order=up?'asc':'desc';
      rows.sort((a,b)=>{const x=cell(a),y=cell(b);const c=numeric?parseFloat(x)-parseFloat(y):x.localeCompare(y);return up?c:-c;});
      rows.forEach(r=>body.appendChild(r));
    }));
  });
})();
</script>
)";

// JSON inside <script>: "</" would end the element; "<\/" is the same JSON string.
// Numbers align right, words left.
bool is_number(const std::string& cell) {
  if (cell.empty()) return true;
  char* end = nullptr;
  std::strtod(cell.c_str(), &end);
  return end && *end == '\0';
}

std::string script_safe_json(const nlohmann::json& j) {
  std::string text = j.dump();
  for (std::size_t at = 0; (at = text.find("</", at)) != std::string::npos; at += 3) text.replace(at, 2, "<\\/");
  return text;
}

}  // namespace

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

HtmlPage::HtmlPage(std::string title) : title_(std::move(title)) {}

void HtmlPage::heading(const std::string& text, int level) {
  const std::string tag = "h" + std::to_string(level < 1 ? 1 : level > 4 ? 4 : level);
  body_ += "<" + tag + ">" + html_escape(text) + "</" + tag + ">\n";
}

void HtmlPage::paragraph(const std::string& text) { body_ += "<p>" + html_escape(text) + "</p>\n"; }

void HtmlPage::preformatted(const std::string& text) { body_ += "<pre>" + html_escape(text) + "</pre>\n"; }

void HtmlPage::table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                     const std::string& caption) {
  ++tables_;
  body_ += "<figure><table class=\"sortable\"><thead><tr>";
  for (const std::string& h : header) body_ += "<th>" + html_escape(h) + "</th>";
  body_ += "</tr></thead><tbody>\n";
  for (const auto& row : rows) {
    body_ += "<tr>";
    for (const std::string& cell : row) body_ += (is_number(cell) ? "<td>" : "<td class=\"text\">") + html_escape(cell) + "</td>";
    body_ += "</tr>\n";
  }
  body_ += "</tbody></table><figcaption>" + html_escape(caption) + " (click a header to sort)</figcaption></figure>\n";
}

void HtmlPage::plot(const nlohmann::json& spec, const std::string& caption) {
  const std::string id = "plot" + std::to_string(++plots_);
  body_ += "<figure><div id=\"" + id + "\"></div><figcaption>" + html_escape(caption) + "</figcaption></figure>\n";
  specs_ += "<script type=\"application/json\" data-plot=\"" + id + "\">" + script_safe_json(spec) + "</script>\n";
}

std::string HtmlPage::render() const {
  return "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>" + html_escape(title_) +
         "</title>\n" + kStyle + inline_vega_scripts() + "</head>\n<body>\n<h1>" + html_escape(title_) + "</h1>\n" + body_ +
         specs_ + kRuntime + "</body></html>\n";
}

}  // namespace tedsim
