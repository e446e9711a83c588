#include "tedsim/report/vega_charts.hpp"

#include <algorithm>
#include <set>

namespace tedsim {
namespace {

using json = nlohmann::json;

constexpr int kWidth = 760;

json axis(const char* orient, const char* scale, const std::string& title, json extra = json::object()) {
  json a = {{"orient", orient}, {"scale", scale}, {"title", title}, {"grid", true}};
  for (auto& [k, v] : extra.items()) a[k] = v;
  return a;
}

std::size_t distinct(const json& rows, const char* field) {
  std::set<std::string> seen;
  for (const json& r : rows) seen.insert(r.value(field, json()).dump());
  return seen.size();
}

json legend(const std::string& title) {
  return {{"fill", "colour"}, {"title", title}, {"orient", "right"}, {"labelLimit", 320}};
}

// The colour scale over `field` of `data`: a fixed domain when given (the legend then lists only
// the values present), else the values as they come.
json colour_scale(const std::vector<std::string>& domain, const char* data, const char* field) {
  if (domain.empty())
    return {{"name", "colour"}, {"type", "ordinal"}, {"domain", {{"data", data}, {"field", field}}}, {"range", "category"}};
  return {{"name", "colour"}, {"type", "ordinal"}, {"domain", domain}, {"range", "category"}};
}

json legend_of(const std::string& title, const std::vector<std::string>& domain, const json& rows, const char* field) {
  json l = legend(title);
  if (domain.empty()) return l;
  std::set<std::string> present;
  for (const json& r : rows)
    if (r.contains(field) && r[field].is_string()) present.insert(r[field].get<std::string>());
  json values = json::array();
  for (const std::string& d : domain)
    if (present.count(d)) values.push_back(d);
  l["values"] = values;
  return l;
}

}  // namespace

json stacked_bars_chart(const json& rows, const StackedBars& o) {
  const std::size_t bars = std::max<std::size_t>(1, distinct(rows, "bar"));
  json data = json::array();
  json numbered = json::array();
  int order = 0;
  for (json r : rows) {
    r["order"] = order++;
    numbered.push_back(r);
  }
  data.push_back({{"name", "rows"},
                  {"values", numbered},
                  {"transform", json::array({{{"type", "stack"}, {"groupby", {"bar"}}, {"field", "value"},
                                              {"sort", {{"field", "order"}}}}})}});
  json x_domain = {{"data", "rows"}, {"field", "y1"}};
  json marks = json::array();
  marks.push_back({{"type", "rect"},
                   {"from", {{"data", "rows"}}},
                   {"encode",
                    {{"enter",
                      {{"y", {{"scale", "y"}, {"field", "bar"}}},
                       {"height", {{"scale", "y"}, {"band", 1}}},
                       {"x", {{"scale", "x"}, {"field", "y0"}}},
                       {"x2", {{"scale", "x"}, {"field", "y1"}}},
                       {"fill", {{"scale", "colour"}, {"field", "part"}}},
                       {"tooltip", {{"signal", "datum.bar + ' | ' + datum.part + ': ' + format(datum.value, '.4~g')"}}}}}}}});
  if (o.limit > 0) {
    data.push_back({{"name", "limit"}, {"values", json::array({{{"x", o.limit}, {"label", o.limit_label}}})}});
    x_domain = {{"fields", json::array({{{"data", "rows"}, {"field", "y1"}}, {{"data", "limit"}, {"field", "x"}}})}};
    marks.push_back({{"type", "rule"},
                     {"from", {{"data", "limit"}}},
                     {"encode",
                      {{"enter",
                        {{"x", {{"scale", "x"}, {"field", "x"}}},
                         {"y", {{"value", 0}}},
                         {"y2", {{"signal", "height"}}},
                         {"stroke", {{"value", "#c0392b"}}},
                         {"strokeWidth", {{"value", 2}}},
                         {"strokeDash", {{"value", {6, 3}}}}}}}}});
    marks.push_back({{"type", "text"},
                     {"from", {{"data", "limit"}}},
                     {"encode",
                      {{"enter",
                        {{"x", {{"scale", "x"}, {"field", "x"}}},
                         {"y", {{"value", -4}}},
                         {"text", {{"field", "label"}}},
                         {"align", {{"value", "right"}}},
                         {"fill", {{"value", "#c0392b"}}},
                         {"fontSize", {{"value", 11}}}}}}}});
  }
  return {{"width", kWidth - 300},
          {"height", int(26 * bars + 10)},
          {"padding", {{"left", 5}, {"right", 5}, {"top", 16}, {"bottom", 5}}},
          {"data", data},
          {"scales",
           json::array({{{"name", "y"}, {"type", "band"}, {"domain", {{"data", "rows"}, {"field", "bar"}}}, {"range", "height"},
                         {"padding", 0.25}},
                        {{"name", "x"}, {"type", "linear"}, {"domain", x_domain}, {"range", "width"}, {"nice", true}, {"zero", true}},
                        colour_scale(o.colour_domain, "rows", "part")})},
          {"axes", json::array({axis("bottom", "x", o.value_title), axis("left", "y", o.bar_title, {{"grid", false}, {"labelLimit", 340}})})},
          {"legends", json::array({legend_of(o.part_title, o.colour_domain, rows, "part")})},
          {"marks", marks}};
}

json grouped_bars_chart(const json& rows, const GroupedBars& o) {
  return {{"width", kWidth - 160},
          {"height", 260},
          {"padding", 5},
          {"data", json::array({{{"name", "rows"}, {"values", rows}}})},
          {"scales",
           json::array({{{"name", "x"}, {"type", "band"}, {"domain", {{"data", "rows"}, {"field", "category"}}}, {"range", "width"},
                         {"padding", 0.2}},
                        {{"name", "y"}, {"type", "linear"}, {"domain", {{"data", "rows"}, {"field", "value"}}}, {"range", "height"},
                         {"nice", true}, {"zero", true}},
                        {{"name", "colour"}, {"type", "ordinal"}, {"domain", {{"data", "rows"}, {"field", "series"}}},
                         {"range", "category"}}})},
          {"axes", json::array({axis("bottom", "x", o.category_title,
                                     {{"grid", false}, {"labelAngle", -30}, {"labelAlign", "right"}, {"labelBaseline", "middle"}}),
                                axis("left", "y", o.value_title)})},
          {"legends", json::array({legend(o.series_title)})},
          {"marks",
           json::array({{{"type", "group"},
                         {"from", {{"facet", {{"data", "rows"}, {"name", "facet"}, {"groupby", "category"}}}}},
                         {"encode", {{"enter", {{"x", {{"scale", "x"}, {"field", "category"}}}}}}},
                         {"signals", json::array({{{"name", "width"}, {"update", "bandwidth('x')"}}})},
                         {"scales", json::array({{{"name", "position"}, {"type", "band"}, {"range", "width"},
                                                  {"domain", {{"data", "facet"}, {"field", "series"}}}}})},
                         {"marks",
                          json::array({{{"type", "rect"},
                                        {"from", {{"data", "facet"}}},
                                        {"encode",
                                         {{"enter",
                                           {{"x", {{"scale", "position"}, {"field", "series"}}},
                                            {"width", {{"scale", "position"}, {"band", 1}}},
                                            {"y", {{"scale", "y"}, {"field", "value"}}},
                                            {"y2", {{"scale", "y"}, {"value", 0}}},
                                            {"fill", {{"scale", "colour"}, {"field", "series"}}},
                                            {"tooltip", {{"signal", "datum.category + ' | ' + datum.series + ': ' + "
                                                                    "format(datum.value, '.4~g')"}}}}}}}}})}}})}};
}

json scatter_chart(const json& points, const json& front, const Scatter& o) {
  json options = json::array();
  for (const std::string& f : o.colour_fields) options.push_back(f);
  const std::string first = o.colour_fields.empty() ? "" : o.colour_fields.front();
  json front_points = front;
  std::sort(front_points.begin(), front_points.end(),
            [](const json& a, const json& b) { return a["x"].get<double>() < b["x"].get<double>(); });
  return {{"width", kWidth - 180},
          {"height", 340},
          {"padding", 5},
          {"signals", json::array({{{"name", "colour_by"},
                                    {"value", first},
                                    {"bind", {{"input", "select"}, {"options", options}, {"name", "colour by "}}}}})},
          {"data", json::array({{{"name", "points"},
                                 {"values", points},
                                 {"transform", json::array({{{"type", "formula"}, {"as", "colour"},
                                                             {"expr", "'' + datum[colour_by]"}}})}},
                                {{"name", "front"}, {"values", front_points}}})},
          {"scales",
           json::array({{{"name", "x"}, {"type", "linear"}, {"domain", {{"data", "points"}, {"field", "x"}}}, {"range", "width"},
                         {"nice", true}, {"zero", false}},
                        {{"name", "y"}, {"type", "linear"}, {"domain", {{"data", "points"}, {"field", "y"}}}, {"range", "height"},
                         {"nice", true}, {"zero", false}},
                        {{"name", "colour"}, {"type", "ordinal"},
                         {"domain", {{"data", "points"}, {"field", "colour"}, {"sort", true}}}, {"range", "category"}}})},
          {"axes", json::array({axis("bottom", "x", o.x_title), axis("left", "y", o.y_title)})},
          {"legends", json::array({{{"fill", "colour"}, {"title", {{"signal", "colour_by"}}}, {"orient", "right"}}})},
          {"marks",
           json::array({{{"type", "symbol"},
                         {"from", {{"data", "points"}}},
                         {"encode",
                          {{"update",
                            {{"x", {{"scale", "x"}, {"field", "x"}}},
                             {"y", {{"scale", "y"}, {"field", "y"}}},
                             {"fill", {{"scale", "colour"}, {"field", "colour"}}},
                             {"size", {{"value", 28}}},
                             {"opacity", {{"value", 0.65}}},
                             {"tooltip", {{"field", "label"}}}}}}}},
                        {{"type", "line"},
                         {"from", {{"data", "front"}}},
                         {"encode",
                          {{"enter",
                            {{"x", {{"scale", "x"}, {"field", "x"}}},
                             {"y", {{"scale", "y"}, {"field", "y"}}},
                             {"stroke", {{"value", "#1d2330"}}},
                             {"strokeWidth", {{"value", 1.5}}},
                             {"interpolate", {{"value", "step-after"}}}}}}}},
                        {{"type", "text"},
                         {"encode",
                          {{"enter",
                            {{"x", {{"signal", "width"}}},
                             {"y", {{"value", -2}}},
                             {"align", {{"value", "right"}}},
                             {"text", {{"value", o.front_title}}},
                             {"fontSize", {{"value", 11}}}}}}}}})}};
}

json line_chart(const json& points, const Lines& o) {
  json marks = json::array();
  marks.push_back({{"type", "group"},
                   {"from", {{"facet", {{"name", "series_points"}, {"data", "points"}, {"groupby", "series"}}}}},
                   {"marks", json::array({{{"type", "line"},
                                           {"from", {{"data", "series_points"}}},
                                           {"encode",
                                            {{"enter",
                                              {{"x", {{"scale", "x"}, {"field", "x"}}},
                                               {"y", {{"scale", "y"}, {"field", "y"}}},
                                               {"stroke", {{"scale", "colour"}, {"field", "series"}}},
                                               {"strokeWidth", {{"value", 1.5}}}}}}}}})}});
  marks.push_back({{"type", "symbol"},
                   {"from", {{"data", "points"}}},
                   {"encode",
                    {{"enter",
                      {{"x", {{"scale", "x"}, {"field", "x"}}},
                       {"y", {{"scale", "y"}, {"field", "y"}}},
                       {"fill", {{"scale", "colour"}, {"field", "series"}}},
                       {"size", {{"value", 22}}},
                       {"tooltip", {{"field", "label"}}}}}}}});
  json data = json::array({{{"name", "points"}, {"values", points}}});
  json y_domain = {{"data", "points"}, {"field", "y"}};
  if (!o.references.empty()) {
    data.push_back({{"name", "references"}, {"values", o.references}});
    y_domain = {{"fields", json::array({{{"data", "points"}, {"field", "y"}}, {{"data", "references"}, {"field", "y"}}})}};
    marks.push_back({{"type", "rule"},
                     {"from", {{"data", "references"}}},
                     {"encode",
                      {{"enter",
                        {{"x", {{"value", 0}}},
                         {"x2", {{"signal", "width"}}},
                         {"y", {{"scale", "y"}, {"field", "y"}}},
                         {"stroke", {{"value", "#c0392b"}}},
                         {"strokeDash", {{"value", {6, 3}}}}}}}}});
    marks.push_back({{"type", "text"},
                     {"from", {{"data", "references"}}},
                     {"encode",
                      {{"enter",
                        {{"x", {{"signal", "width"}}},
                         {"y", {{"scale", "y"}, {"field", "y"}}},
                         {"dy", {{"value", -4}}},
                         {"align", {{"value", "right"}}},
                         {"text", {{"field", "label"}}},
                         {"fill", {{"value", "#c0392b"}}},
                         {"fontSize", {{"value", 11}}}}}}}});
  }
  const auto scale = [](const char* name, bool log, bool zero, const char* range, json domain) {
    json s = {{"name", name}, {"type", log ? "log" : "linear"}, {"domain", domain}, {"range", range}, {"nice", std::string(name) == "y"}};
    if (!log) s["zero"] = zero;
    return s;
  };
  return {{"width", kWidth - 200},
          {"height", 300},
          {"padding", 5},
          {"data", data},
          {"scales", json::array({scale("x", o.x_log, false, "width", {{"data", "points"}, {"field", "x"}}),
                                  scale("y", o.y_log, o.y_zero, "height", y_domain),
                                  {{"name", "colour"}, {"type", "ordinal"},
                                   {"domain", {{"data", "points"}, {"field", "series"}}}, {"range", "category"}}})},
          {"axes", json::array({axis("bottom", "x", o.x_title,
                                     o.x_log       ? json{{"format", "~s"}}
                                     : o.x_integer ? json{{"tickMinStep", 1}, {"format", "d"}}
                                                   : json::object()),
                                axis("left", "y", o.y_title, o.y_log ? json{{"format", "~s"}} : json::object())})},
          {"legends", json::array({legend(o.series_title)})},
          {"marks", marks}};
}

json timeline_chart(const json& events, const Timeline& o) {
  const std::size_t lanes = std::max<std::size_t>(1, distinct(events, "lane"));
  return {{"width", kWidth - 200},
          {"height", int(std::min<std::size_t>(lanes, 40) * 24 + 10)},
          {"padding", 5},
          {"data", json::array({{{"name", "events"}, {"values", events}}})},
          {"scales",
           json::array({{{"name", "y"}, {"type", "band"}, {"domain", {{"data", "events"}, {"field", "lane"}}}, {"range", "height"},
                         {"padding", 0.15}},
                        {{"name", "x"}, {"type", "linear"},
                         {"domain", {{"fields", json::array({{{"data", "events"}, {"field", "start"}},
                                                             {{"data", "events"}, {"field", "end"}}})}}},
                         {"range", "width"}, {"zero", true}},
                        colour_scale(o.colour_domain, "events", "colour")})},
          {"axes", json::array({axis("bottom", "x", o.time_title), axis("left", "y", o.lane_title, {{"grid", false}, {"labelLimit", 240}})})},
          {"legends", json::array({legend_of(o.colour_title, o.colour_domain, events, "colour")})},
          {"marks",
           json::array({{{"type", "rect"},
                         {"from", {{"data", "events"}}},
                         {"encode",
                          {{"enter",
                            {{"y", {{"scale", "y"}, {"field", "lane"}}},
                             {"height", {{"scale", "y"}, {"band", 1}}},
                             {"x", {{"scale", "x"}, {"field", "start"}}},
                             {"x2", {{"scale", "x"}, {"field", "end"}}},
                             {"fill", {{"scale", "colour"}, {"field", "colour"}}},
                             {"tooltip", {{"signal", "datum.name + ' (' + datum.colour + '): ' + format(datum.start, '.4~f') + "
                                                     "' to ' + format(datum.end, '.4~f')"}}}}}}}}})}};
}

}  // namespace tedsim
