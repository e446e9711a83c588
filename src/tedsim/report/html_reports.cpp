#include "tedsim/report/html_reports.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "tedsim/core/atomic_file.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/profile/measured_profile.hpp"
#include "tedsim/report/html_ops.hpp"
#include "tedsim/report/html_page.hpp"
#include "tedsim/report/vega_charts.hpp"

namespace tedsim {
namespace {

using json = nlohmann::json;

constexpr double kGiBytes = 1024.0 * 1024.0 * 1024.0;
constexpr std::size_t kMaxScatterPoints = 6000;  // beyond this the page slows; the front is always kept
constexpr std::size_t kMaxTimelineEvents = 20000;

// The cost model's phases and memory parts in their order: each keeps one colour on every chart.
const std::vector<std::string> kPhases = {"compute", "tp_allreduce", "tp_allgather", "ep_alltoall", "dp_grad_sync",
                                          "optimizer", "other", "pp_bubble", "pp_p2p", "host_launch", "cp_ring"};
const std::vector<std::string> kMemoryParts = {"weights", "grads", "optimizer", "activations", "moe_buffers",
                                               "cac_stash", "pipeline_buffers", "optimizer_spike"};

std::string num(double v, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  return buf;
}

double number(const json& j, const char* key, double fallback = 0) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string text(const json& j, const char* key, const std::string& fallback = "") {
  const auto it = j.find(key);
  if (it == j.end()) return fallback;
  return it->is_string() ? it->get<std::string>() : it->dump();
}

std::string on_off(const json& config, const char* key) { return config.value(key, false) ? "on" : "off"; }

// "p1 v1 t2 e16 d64 b1 zero2 ted ..." from a JSON config: what a plan is called on the page.
std::string plan_name(const json& c) {
  std::string s = "p" + text(c, "pp") + " t" + text(c, "tp") + (number(c, "cp", 1) > 1 ? " c" + text(c, "cp") : std::string()) +
                  " e" + text(c, "ep") + " d" + text(c, "dp") + " b" +
                  text(c, "micro_batch");
  if (number(c, "vpp", 1) > 1) s += " v" + text(c, "vpp");
  s += " zero" + text(c, "zero") + " " + text(c, "recompute");
  if (c.value("dtd", false)) s += " dtd";
  if (c.value("cac", false)) s += " cac";
  if (c.value("sequence_parallel", false)) s += " sp";
  if (c.value("expert_tp", false) && number(c, "tp", 1) > 1) s += " etp";
  if (c.value("moe_dispatcher", std::string("alltoall")) == "flex") s += " flex";
  if (c.value("adam_moments", std::string("fp32")) == "bf16") s += " m16";
  if (const std::string cg = c.value("cuda_graph_scope", std::string("none")); cg != "none") s += " cg(" + cg + ")";
  if (c.value("fused_grouped_mlp", false)) s += " fmlp";
  if (c.value("fp8_attention", false)) s += " fp8a";
  if (c.value("moe_a2a_overlap", false)) s += " a2ao";
  s += " " + text(c, "layout");
  return s;
}

// The phases of a breakdown with any time, in the document's order.
json breakdown_rows(const json& breakdown, const std::string& bar, double scale) {
  json rows = json::array();
  for (const auto& [phase, seconds] : breakdown.items())
    if (seconds.is_number() && seconds.get<double>() > 0)
      rows.push_back({{"bar", bar}, {"part", phase}, {"value", seconds.get<double>() * scale}});
  return rows;
}

json memory_rows(const json& memory, const std::string& bar) {
  json rows = json::array();
  for (const std::string& part : kMemoryParts) {
    const double gib = number(memory, (part + "_gib").c_str());
    if (gib > 0) rows.push_back({{"bar", bar}, {"part", part}, {"value", gib}});
  }
  return rows;
}

void append(json& rows, const json& more) {
  for (const json& r : more) rows.push_back(r);
}

StackedBars bars(std::string value_title, std::string bar_title, std::string part_title, double limit = 0,
                 std::string limit_label = "") {
  StackedBars b;
  b.colour_domain = part_title == "phase" ? kPhases : kMemoryParts;
  b.value_title = std::move(value_title);
  b.bar_title = std::move(bar_title);
  b.part_title = std::move(part_title);
  b.limit = limit;
  b.limit_label = std::move(limit_label);
  return b;
}

std::string inputs_line(const json& doc) {
  std::string s;
  for (const char* key : {"model", "topology", "profile"})
    if (doc.contains(key)) s += (s.empty() ? "" : ", ") + std::string(key) + " " + text(doc, key);
  return s;
}

// ---- simulate -------------------------------------------------------------------------------

// " (17.06-17.80 ms over the profile's spread)" when the prediction carries its range.
std::string spread_text(const json& p) {
  const auto it = p.find("iteration_time_s_range");
  if (it == p.end() || !it->is_array() || it->size() != 2) return "";
  return " (" + num(1e3 * (*it)[0].get<double>(), 2) + "-" + num(1e3 * (*it)[1].get<double>(), 2) +
         " ms over the measured profile's spread)";
}

void prediction_summary(HtmlPage& page, const json& p) {
  const json& mem = p.value("memory", json::object());
  page.paragraph("iteration " + num(1e3 * number(p, "iteration_time_s"), 2) + " ms" + spread_text(p) + ", " +
                 num(number(p, "tokens_per_s"), 0) +
                 " tokens/s, " + num(number(p, "tflops_per_gpu"), 1) + " TFLOP/s per device (MFU " +
                 num(100 * number(p, "mfu"), 1) + "%), peak memory " + num(number(mem, "peak_gib"), 2) + " of " +
                 num(number(mem, "capacity_gib"), 2) + " GiB" + (p.value("fits", true) ? "" : " (DOES NOT FIT)"));
}

void breakdown_plot(HtmlPage& page, const json& p) {
  json rows = breakdown_rows(p.value("breakdown_s", json::object()), "exposed", 1e3);
  append(rows, breakdown_rows(p.value("busy_s", json::object()), "busy", 1e3));
  if (rows.empty()) return;
  page.plot(stacked_bars_chart(rows, bars("time per iteration (ms)", "time counted", "phase")),
            "Where the iteration goes: exposed time per phase (what the iteration waits for; sums to the iteration) "
            "and busy time (everything each phase runs, hidden or not).");
}

void memory_plot(HtmlPage& page, const json& p) {
  json rows = json::array();
  const json& stages = p.value("stages", json::array());
  if (stages.size() > 1) {
    for (const json& s : stages)
      if (s.contains("memory")) append(rows, memory_rows(s["memory"], "stage " + text(s, "stage")));
  } else {
    append(rows, memory_rows(p.value("memory", json::object()), "peak"));
  }
  if (rows.empty()) return;
  const double capacity = number(p.value("memory", json::object()), "capacity_gib");
  page.plot(stacked_bars_chart(rows, bars("memory per device (GiB)", stages.size() > 1 ? "pipeline stage" : "device", "part",
                                      capacity, "usable device memory " + num(capacity, 1) + " GiB")),
            stages.size() > 1 ? "Memory per device on each pipeline stage by part, against the usable device memory."
                              : "Memory per device by part at its peak, against the usable device memory.");
}

void timeline_plot(HtmlPage& page, const json& timeline) {
  if (!timeline.is_array() || timeline.empty()) return;
  json events = json::array();
  for (const json& e : timeline) {
    if (events.size() >= kMaxTimelineEvents) break;
    const double start = 1e3 * number(e, "start_s"), end = start + 1e3 * number(e, "duration_s");
    events.push_back({{"lane", text(e, "lane")}, {"start", start}, {"end", end}, {"name", text(e, "name")},
                      {"colour", text(e, "phase")}});
  }
  Timeline options{"time in the iteration (ms)", "stream", "phase", kPhases};
  page.plot(timeline_chart(events, options),
            "The simulated iteration: every operation on its stream (hover for its name)" +
                std::string(timeline.size() > kMaxTimelineEvents
                                ? "; the first " + std::to_string(kMaxTimelineEvents) + " of " + std::to_string(timeline.size()) + " events"
                                : "") +
                ". The full trace: simulate --trace FILE, in ui.perfetto.dev.");
}

void simulate_section(HtmlPage& page, const json& p) {
  page.heading("Prediction: " + plan_name(p.value("config", json::object())));
  if (!inputs_line(p).empty()) page.paragraph(inputs_line(p));
  prediction_summary(page, p);
  breakdown_plot(page, p);
  memory_plot(page, p);
  if (p.contains("timeline"))
    timeline_plot(page, p["timeline"]);
  else
    page.paragraph("The timeline is drawn by simulate --html (saved --json results leave it out; simulate --trace FILE "
                   "writes it for ui.perfetto.dev).");
  if (p.contains("ops")) ops_section(page, p["ops"]);
}

// ---- search ---------------------------------------------------------------------------------

const std::vector<std::string>& knob_fields() {
  static const std::vector<std::string> fields = {"layout", "zero", "recompute", "pp", "tp", "cp", "ep", "micro_batch",
                                                  "dtd", "cac", "sequence_parallel", "expert_tp", "vpp"};
  return fields;
}

void search_section(HtmlPage& page, const json& doc) {
  page.heading("Search");
  if (!inputs_line(doc).empty()) page.paragraph(inputs_line(doc));
  const double seconds = number(doc, "seconds");
  page.paragraph("evaluated " + text(doc, "evaluated") + ", feasible " + text(doc, "feasible") + ", " +
                 num(seconds > 0 ? number(doc, "evaluated") / seconds : 0, 0) + " evaluations/s, " + num(seconds, 3) + " s");
  const json& results = doc.value("results", json::array());
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> folded;
  int rank = 0;
  for (const json& p : results) {
    const json& c = p.value("config", json::object());
    ++rank;
    if (p.contains("folded_into_rank")) {  // search_json decided, as the text table does
      folded.push_back("rank " + std::to_string(rank) + " (" + plan_name(c) + ") predicts exactly what rank " +
                       text(p, "folded_into_rank") + " does");
      continue;
    }
    rows.push_back({std::to_string(rank), text(c, "pp"), text(c, "vpp"), text(c, "tp"), text(c, "cp", "1"), text(c, "ep"), text(c, "dp"),
                    text(c, "dp_expert"), text(c, "micro_batch"), text(c, "grad_accum"), on_off(c, "sequence_parallel"),
                    text(c, "recompute"), on_off(c, "dtd"), on_off(c, "cac"), text(c, "zero"),
                    number(c, "tp", 1) > 1 ? on_off(c, "expert_tp") : std::string("off"), text(c, "layout"), num(number(p, "iteration_time_s"), 4), num(number(p, "tokens_per_s"), 0),
                    num(number(p, "tflops_per_gpu"), 1), num(100 * number(p, "mfu"), 1),
                    num(number(p.value("memory", json::object()), "peak_gib"), 2)});
  }
  page.table({"rank", "p", "v", "t", "c", "e", "d", "d_e", "b", "ga", "sp", "recompute", "dtd", "cac", "zero", "etp", "layout",
              "iter_s", "tokens/s", "TFLOP/s/dev", "MFU%", "peak_GiB"},
             rows, "The best " + std::to_string(results.size()) + " configurations by predicted throughput" +
                       (folded.empty() ? std::string()
                                       : "; " + std::to_string(folded.size()) +
                                             (folded.size() == 1 ? " plan that predicts exactly what the row above it does is"
                                                                 : " plans that predict exactly what the row above them does are") +
                                             " folded (listed below; search --all prints them as rows)"));
  if (!folded.empty()) {
    std::string lines;
    for (const std::string& f : folded) lines += f + "\n";
    page.preformatted(lines);
  }
  const std::size_t few = std::min<std::size_t>(results.size(), 5);
  json time_rows = json::array(), memory = json::array();
  double capacity = 0;
  for (std::size_t i = 0; i < few; ++i) {
    const std::string bar = "#" + std::to_string(i + 1) + " " + plan_name(results[i].value("config", json::object()));
    append(time_rows, breakdown_rows(results[i].value("breakdown_s", json::object()), bar, 1e3));
    append(memory, memory_rows(results[i].value("memory", json::object()), bar));
    capacity = number(results[i].value("memory", json::object()), "capacity_gib");
  }
  if (!time_rows.empty())
    page.plot(stacked_bars_chart(time_rows, bars("exposed time per iteration (ms)", "plan", "phase")),
              "What each of the best " + std::to_string(few) + " plans waits for: exposed time per phase, summing to its iteration.");
  if (!memory.empty())
    page.plot(stacked_bars_chart(memory, bars("memory per device (GiB)", "plan", "part", capacity,
                                          "usable device memory " + num(capacity, 1) + " GiB")),
              "Peak memory per device of the best " + std::to_string(few) + " plans by part, against the usable device memory.");
  const json& points = doc.value("points", json::array());
  if (!points.empty()) {
    std::vector<double> memory, throughput;
    for (const json& pt : points) {
      memory.push_back(number(pt, "peak_gib"));
      throughput.push_back(number(pt, "tokens_per_s"));
    }
    const std::vector<std::size_t> front_index = pareto_front(memory, throughput);
    const std::set<std::size_t> on_front(front_index.begin(), front_index.end());
    json front = json::array();
    for (std::size_t i : front_index) front.push_back({{"x", memory[i]}, {"y", throughput[i]}});
    const std::size_t stride = points.size() > kMaxScatterPoints ? (points.size() + kMaxScatterPoints - 1) / kMaxScatterPoints : 1;
    json drawn = json::array();
    for (std::size_t i = 0; i < points.size(); ++i) {
      if (i % stride != 0 && !on_front.count(i)) continue;
      const json& pt = points[i];
      json d = {{"x", number(pt, "peak_gib")}, {"y", number(pt, "tokens_per_s")},
                {"label", text(pt, "plan") + ": " + num(number(pt, "tokens_per_s"), 0) + " tokens/s, " +
                              num(number(pt, "peak_gib"), 2) + " GiB"}};
      for (const std::string& f : knob_fields())
        if (pt.contains(f)) d[f] = pt[f];
      drawn.push_back(d);
    }
    std::vector<std::string> fields;
    for (const std::string& f : knob_fields())
      if (points.front().contains(f)) fields.push_back(f);
    page.plot(scatter_chart(drawn, front, {"peak memory per device (GiB)", "throughput (tokens/s)", fields, "Pareto front"}),
              "Every feasible configuration" +
                  std::string(stride > 1 ? " (every " + std::to_string(stride) + "th, and the whole front, of " +
                                               std::to_string(points.size()) + ")"
                                         : " (" + std::to_string(points.size()) + ")") +
                  ": throughput against peak memory, coloured by the knob chosen below the plot; the line is the Pareto "
                  "front (no plan is both faster and smaller).");
  }
  if (doc.contains("why") && doc["why"].is_array() && !doc["why"].empty()) {
    std::string why;
    for (const json& line : doc["why"]) why += line.get<std::string>() + "\n";
    page.heading("Why this plan", 3);
    page.preformatted(why);
  }
}

// ---- validate -------------------------------------------------------------------------------

void validate_section(HtmlPage& page, const json& doc) {
  const json& pred = doc.value("predicted", json::object());
  const json& meas = doc.value("measured", json::object());
  page.heading("Validation: " + plan_name(doc.value("config", json::object())));
  page.paragraph(inputs_line(doc) + "; " + text(doc, "ranks") + " ranks on the " + text(doc, "backend") + " backend");
  const double p_iter = number(pred, "iteration_time_s"), m_iter = number(meas, "iteration_time_s");
  page.paragraph("iteration: predicted " + num(1e3 * p_iter, 3) + " ms" + spread_text(pred) + ", measured " + num(1e3 * m_iter, 3) + " ms (median), error " +
                 (m_iter > 0 ? num(100 * (p_iter - m_iter) / m_iter, 1) + "%" : std::string("n/a")));
  json rows = json::array();
  std::vector<std::vector<std::string>> table;
  const json& pb = pred.value("breakdown_s", json::object());
  const json& mb = meas.value("breakdown_s", json::object());
  for (const auto& [phase, p] : pb.items()) {
    const double pv = p.is_number() ? p.get<double>() : 0, mv = number(mb, phase.c_str());
    if (pv <= 0 && mv <= 0) continue;
    rows.push_back({{"category", phase}, {"series", "predicted"}, {"value", 1e3 * pv}});
    rows.push_back({{"category", phase}, {"series", "measured"}, {"value", 1e3 * mv}});
    table.push_back({phase, num(1e3 * pv, 3), num(1e3 * mv, 3), mv > 0 ? num(100 * (pv - mv) / mv, 1) : "n/a"});
  }
  rows.push_back({{"category", "iteration"}, {"series", "predicted"}, {"value", 1e3 * p_iter}});
  rows.push_back({{"category", "iteration"}, {"series", "measured"}, {"value", 1e3 * m_iter}});
  table.push_back({"iteration", num(1e3 * p_iter, 3), num(1e3 * m_iter, 3), m_iter > 0 ? num(100 * (p_iter - m_iter) / m_iter, 1) : "n/a"});
  page.plot(grouped_bars_chart(rows, {"phase", "time per iteration (ms)", "time"}),
            "Predicted against measured time per phase (measured: mean over ranks, median over iterations) and for the "
            "iteration (the slowest rank's).");
  page.table({"phase", "predicted ms", "measured ms", "error %"}, table, "Predicted against measured, phase by phase");
  const json& spread = meas.value("spread", json::object());
  const json& times = spread.value("iteration_times_s", json::array());
  if (!times.empty()) {
    json points = json::array();
    int i = 0;
    for (const json& t : times) {
      ++i;
      points.push_back({{"x", i}, {"y", 1e3 * t.get<double>()}, {"series", "measured iteration"},
                        {"label", "iteration " + std::to_string(i) + ": " + num(1e3 * t.get<double>(), 3) + " ms"}});
    }
    Lines lines{"measured iteration (after " + text(spread, "warmup", "0") + " warm-up)", "iteration time (ms)", "series"};
    lines.x_integer = true;
    lines.references = json::array({{{"y", 1e3 * p_iter}, {"label", "predicted " + num(1e3 * p_iter, 2) + " ms"}},
                                    {{"y", 1e3 * number(spread, "median")}, {"label", "measured median"}}});
    page.plot(line_chart(points, lines),
              "The iteration time of each measured iteration (slowest rank), with the prediction and the measured median; "
              "spread p10 " + num(1e3 * number(spread, "p10"), 2) + " ms to p90 " + num(1e3 * number(spread, "p90"), 2) + " ms.");
  }
  const double pm = number(pred, "memory_peak_bytes"), mm = number(meas, "memory_peak_bytes");
  if (pm > 0 || mm > 0) {
    const double mib = 1024.0 * 1024.0;
    json mem = json::array({{{"category", "peak of the step's tensors"}, {"series", "predicted"}, {"value", pm / mib}},
                            {{"category", "peak of the step's tensors"}, {"series", "measured"}, {"value", mm / mib}}});
    if (number(meas, "max_rss_bytes") > 0)
      mem.push_back({{"category", "process max RSS"}, {"series", "measured"}, {"value", number(meas, "max_rss_bytes") / mib}});
    page.plot(grouped_bars_chart(mem, {"what is counted", "memory per rank (MiB)", "memory"}),
              "Predicted against measured memory per rank: the peak of the step's own tensors (max over ranks), and the "
              "process's max RSS, which also holds MPI's buffers and the binary.");
  }
}

// ---- scale ----------------------------------------------------------------------------------

void scale_section(HtmlPage& page, const json& doc) {
  page.heading("Best plan per cluster size");
  if (!inputs_line(doc).empty()) page.paragraph(inputs_line(doc));
  std::vector<std::vector<std::string>> rows;
  json per_gpu = json::array(), breakdown = json::array();
  for (const json& s : doc.value("sizes", json::array())) {
    const std::string gpus = text(s, "gpus");
    if (!s.contains("best") || s["best"].is_null()) {
      rows.push_back({gpus, "no configuration fits", "", "", "", "", "", ""});
      continue;
    }
    const json& b = s["best"];
    const double tokens = number(b, "tokens_per_s"), g = number(s, "gpus", 1);
    rows.push_back({gpus, plan_name(b.value("config", json::object())), num(number(b, "iteration_time_s"), 4), num(tokens, 0),
                    num(tokens / g, 1), num(number(b, "tflops_per_gpu"), 1), num(100 * number(b, "mfu"), 1),
                    num(number(b.value("memory", json::object()), "peak_gib"), 2)});
    per_gpu.push_back({{"x", g}, {"y", tokens / g}, {"series", "best plan"},
                       {"label", gpus + " devices: " + num(tokens / g, 1) + " tokens/s per device (" +
                                     plan_name(b.value("config", json::object())) + ")"}});
    append(breakdown, breakdown_rows(b.value("breakdown_s", json::object()), gpus + " devices", 1e3));
  }
  page.table({"devices", "best plan", "iter_s", "tokens/s", "tokens/s/dev", "TFLOP/s/dev", "MFU%", "peak_GiB"}, rows,
             "The best plan the search finds for each cluster size");
  if (!per_gpu.empty()) {
    Lines lines{"devices", "throughput per device (tokens/s)", "series"};
    lines.x_log = true;
    lines.y_zero = true;
    page.plot(line_chart(per_gpu, lines),
              "Throughput per device of the best plan at each cluster size, for the same global batch of " +
                  text(doc, "global_batch") + " sequences: flat is perfect strong scaling.");
  }
  if (!breakdown.empty())
    page.plot(stacked_bars_chart(breakdown, bars("exposed time per iteration (ms)", "cluster size", "phase")),
              "What the best plan at each cluster size waits for: exposed time per phase.");
}

// ---- profile --------------------------------------------------------------------------------

void profile_section(HtmlPage& page, const json& doc, const std::string& source) {
  const ProfileData d = profile_from_json(doc.dump(), source);
  const Provenance& p = d.provenance;
  page.heading("Profile " + source);
  const auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? std::string("-") : s;
  };
  page.table({"provenance", ""},
             {{"hosts", join(p.hosts)},
              {"devices", join(p.devices)},
              {"backend", p.backend + ", " + std::to_string(p.ranks) + " ranks, " + std::to_string(p.ranks_per_node) + " per host"},
              {"cpu", p.cpu_model.empty() ? "-" : p.cpu_model},
              {"cuda / cublas / nccl / mpi", p.cuda + " / " + p.cublas + " / " + p.nccl + " / " + p.mpi},
              {"date", p.date},
              {"tedsim", p.tedsim_version + " (" + p.build_flags + ")"},
              {"complete", d.complete ? "yes" : "no (a partial calibration)"}},
             "Where and how the profile was measured");
  json gemm = json::array();
  for (const GemmPoint& x : d.gemms) {
    const double flops = x.shape.flops(), s = x.seconds.median_s;
    if (flops <= 0 || s <= 0) continue;
    const std::string family = "n=" + std::to_string(x.shape.n) + " k=" + std::to_string(x.shape.k) +
                               (x.shape.batch > 1 ? (x.shape.grouped ? " experts " : " batch ") + std::to_string(x.shape.batch) : "") + " " + to_string(x.shape.dtype);
    gemm.push_back({{"x", flops}, {"y", flops / s / 1e12}, {"series", family},
                    {"label", "m=" + std::to_string(x.shape.m) + " " + family + ": " + num(flops / s / 1e12, 3) + " TFLOP/s"}});
  }
  if (!gemm.empty()) {
    Lines lines{"FLOPs per GEMM", "achieved TFLOP/s", "shape family (n, k)"};
    lines.x_log = true;
    page.plot(line_chart(gemm, lines), "Measured GEMM rate against its size, one line per family of shapes (the same n and "
                                       "k, the token count m varying).");
  }
  json coll = json::array();
  for (const CollectivePoint& x : d.collectives) {
    if (x.bytes <= 0 || x.busbw_gbs <= 0) continue;
    const std::string series = std::string(to_string(x.op)) + " " + describe_span(x.span);
    coll.push_back({{"x", x.bytes}, {"y", x.busbw_gbs}, {"series", series},
                    {"label", series + ", " + num(x.bytes, 0) + " B: " + num(x.busbw_gbs, 3) + " GB/s"}});
  }
  if (!coll.empty()) {
    Lines lines{"message size (bytes)", "bus bandwidth (GB/s)", "collective, group shape"};
    lines.x_log = true;
    lines.y_log = true;
    page.plot(line_chart(coll, lines), "Each collective's bus bandwidth against message size, per group shape (as "
                                       "nccl-tests reports it).");
  }
  json kern = json::array();
  for (const KernelPoint& x : d.kernels) {
    if (x.bytes <= 0 || x.seconds.median_s <= 0) continue;
    const std::string series = std::string(to_string(x.kind)) + " " + to_string(x.dtype);
    const double gbs = x.bytes / x.seconds.median_s / 1e9;
    kern.push_back({{"x", x.bytes}, {"y", gbs}, {"series", series},
                    {"label", series + ", " + num(x.bytes, 0) + " B: " + num(gbs, 2) + " GB/s"}});
  }
  if (!kern.empty()) {
    Lines lines{"bytes moved", "achieved GB/s", "kernel"};
    lines.x_log = true;
    lines.y_log = true;
    page.plot(line_chart(kern, lines), "Memory-bound kernels: achieved bandwidth against the bytes each moves.");
  }
  page.paragraph(std::to_string(d.gemms.size()) + " GEMM, " + std::to_string(d.kernels.size()) + " kernel and " +
                 std::to_string(d.collectives.size()) + " collective points (tedsim profile show FILE lists them).");
}

}  // namespace

std::vector<std::size_t> pareto_front(const std::vector<double>& peak_memory, const std::vector<double>& throughput) {
  std::vector<std::size_t> order(std::min(peak_memory.size(), throughput.size()));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return peak_memory[a] != peak_memory[b] ? peak_memory[a] < peak_memory[b] : throughput[a] > throughput[b];
  });
  std::vector<std::size_t> front;
  double best = 0;
  for (std::size_t i : order)
    if (front.empty() || throughput[i] > best) {
      best = throughput[i];
      front.push_back(i);
    }
  return front;
}

std::string report_kind(const json& doc) {
  if (!doc.is_object()) return "";
  if (doc.contains("kind") && doc["kind"].is_string()) return doc["kind"].get<std::string>();
  if (doc.value("format", "") == "tedsim-profile") return "profile";
  if (doc.contains("sizes")) return "scale";
  if (doc.contains("results") && doc.contains("evaluated")) return "search";
  if (doc.contains("predicted") && doc.contains("measured")) return "validate";
  if (doc.contains("iteration_time_s") && doc.contains("breakdown_s")) return "simulate";
  return "";
}

std::string html_report(const std::vector<json>& docs, const std::vector<std::string>& sources) {
  std::set<std::string> kinds;
  for (const json& d : docs) kinds.insert(report_kind(d));
  const std::string title = docs.size() == 1 && !kinds.count("")
                                ? "tedsim " + *kinds.begin() + " report"
                                : "tedsim report";
  HtmlPage page(title);
  for (std::size_t i = 0; i < docs.size(); ++i) {
    const std::string source = i < sources.size() ? sources[i] : "document " + std::to_string(i + 1);
    const std::string kind = report_kind(docs[i]);
    if (kind == "simulate") simulate_section(page, docs[i]);
    else if (kind == "search") search_section(page, docs[i]);
    else if (kind == "validate") validate_section(page, docs[i]);
    else if (kind == "scale") scale_section(page, docs[i]);
    else if (kind == "profile") profile_section(page, docs[i], source);
    else
      throw InputError(source + ": not a tedsim result: expected the JSON of search, simulate, validate or scale "
                       "(--json FILE) or a profile (tedsim calibrate)");
  }
  return page.render();
}

void write_html_report(const std::string& path, const std::vector<json>& docs, const std::vector<std::string>& sources) {
  write_file_atomically(path, html_report(docs, sources));
}

}  // namespace tedsim
