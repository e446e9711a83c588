// The HTML page builder and the report dispatch: escaping, scripts that cannot be cut short by
// their data, nothing to fetch outside scripts, the Pareto front, and clear errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tedsim/core/error.hpp"
#include "tedsim/report/html_page.hpp"
#include "tedsim/report/html_reports.hpp"
#include "tedsim/report/vega_charts.hpp"

namespace tedsim {
namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(HtmlPage, EscapesText) {
  EXPECT_EQ(html_escape("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
}

TEST(HtmlPage, DataCannotEndItsScriptEarly) {
  HtmlPage page("t");
  nlohmann::json rows = nlohmann::json::array({{{"bar", "</script><script>alert(1)"}, {"part", "p"}, {"value", 1.0}}});
  StackedBars options;
  options.value_title = "s";
  page.plot(stacked_bars_chart(rows, options), "caption");
  const std::string html = page.render();
  // The plot's JSON runs to the first "</script>" after it and is still whole, valid JSON.
  const std::string open = "data-plot=\"plot1\">";
  const std::size_t start = html.find(open);
  ASSERT_NE(start, std::string::npos);
  const std::size_t from = start + open.size();
  const std::string body = html.substr(from, html.find("</script>", from) - from);
  const nlohmann::json spec = nlohmann::json::parse(body, nullptr, false);
  ASSERT_FALSE(spec.is_discarded()) << body.substr(0, 200);
  EXPECT_EQ(spec["data"][0]["values"][0]["bar"], "</script><script>alert(1)");
}

TEST(HtmlPage, NamesNothingToFetchOutsideItsScripts) {
  HtmlPage page("t");
  page.heading("h");
  page.paragraph("see <a href=\"http://example.org\">x</a>");
  page.table({"a"}, {{"<img src=x>"}}, "c");
  // The page without its <script> elements (libstdc++'s regex recurses too deep for this).
  const std::string full = page.render();
  std::string html;
  for (std::size_t at = 0;;) {
    const std::size_t open = full.find("<script", at);
    html += full.substr(at, open == std::string::npos ? std::string::npos : open - at);
    if (open == std::string::npos) break;
    at = full.find("</script>", open) + 9;
  }
  EXPECT_NE(html.find("&lt;img src=x&gt;"), std::string::npos);  // the table cell, as text
  EXPECT_EQ(html.find("src=\""), std::string::npos);
  EXPECT_EQ(html.find("href=\""), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
}

TEST(HtmlPage, InlinesEveryVegaModuleItNeeds) {
  HtmlPage page("t");
  const std::string html = page.render();
  for (const char* module : {"vega-util", "vega-scale", "vega-view", "vega-parser", "vega-encode", "vega-selections"})
    EXPECT_NE(html.find(std::string("__tedsimVegaName='") + module + "'"), std::string::npos) << module;
}

TEST(HtmlPage, MissingVegaIsAClearError) {
  setenv("TEDSIM_VEGA_DIR", "/nonexistent/vega", 1);
  HtmlPage page("t");
  try {
    page.render();
    ADD_FAILURE() << "no error without Vega";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/vega/vega-util.min.js"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("libjs-vega"), std::string::npos) << e.what();
  }
  unsetenv("TEDSIM_VEGA_DIR");
}

TEST(Reports, KnowsEachKindOfResult) {
  EXPECT_EQ(report_kind({{"kind", "scale"}}), "scale");
  EXPECT_EQ(report_kind({{"format", "tedsim-profile"}, {"version", 1}}), "profile");
  EXPECT_EQ(report_kind({{"results", nlohmann::json::array()}, {"evaluated", 3}}), "search");
  EXPECT_EQ(report_kind({{"predicted", 1}, {"measured", 2}}), "validate");
  EXPECT_EQ(report_kind({{"iteration_time_s", 1}, {"breakdown_s", 2}}), "simulate");
  EXPECT_EQ(report_kind({{"something", 1}}), "");
  EXPECT_EQ(report_kind(nlohmann::json::array()), "");
}

TEST(Reports, AnUnknownDocumentNamesItsSource) {
  try {
    html_report({{{"something", 1}}}, {"results/x.json"});
    ADD_FAILURE() << "no error for an unknown document";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("results/x.json: not a tedsim result"), std::string::npos) << e.what();
  }
}

TEST(Reports, ParetoFrontKeepsOnlyUnbeatenPlans) {
  // memory, throughput: plan 2 is beaten by plan 0 (less memory, more throughput); plan 4 ties
  // plan 1's memory with less throughput.
  const std::vector<double> memory = {4, 6, 5, 9, 6};
  const std::vector<double> throughput = {10, 30, 8, 35, 20};
  EXPECT_EQ(pareto_front(memory, throughput), (std::vector<std::size_t>{0, 1, 3}));
  EXPECT_TRUE(pareto_front({}, {}).empty());
}

// As in search's text table: a plan predicting exactly what the row above does is a note, not a row.
TEST(Reports, SearchFoldsPlansThatPredictTheSame) {
  const auto result = [](double seconds, int zero) {
    return nlohmann::json{{"iteration_time_s", seconds},
                          {"tokens_per_s", 1000 / seconds},
                          {"memory", {{"peak_gib", 10.0}, {"capacity_gib", 15.0}}},
                          {"config", {{"pp", 1}, {"tp", 1}, {"ep", 2}, {"dp", 4}, {"micro_batch", 1}, {"zero", zero}}}};
  };
  nlohmann::json doc = {{"kind", "search"},
                              {"evaluated", 3},
                              {"feasible", 3},
                              {"seconds", 0.1},
                              {"results", nlohmann::json::array({result(1.0, 1), result(1.0, 2), result(1.5, 3)})}};
  doc["results"][1]["folded_into_rank"] = 1;  // as search_json marks it
  const std::string html = html_report({doc}, {"search"});
  EXPECT_NE(html.find("rank 2 (p1 t1 e2 d4 b1 zero2"), std::string::npos);
  EXPECT_NE(html.find("1 plan that predicts exactly what the row above it does is folded"), std::string::npos);
  EXPECT_EQ(count(html, "<tr><td>"), 2u);  // ranks 1 and 3 as rows
}

TEST(Reports, SimulateDocumentGetsItsPlots) {
  nlohmann::json doc = {{"kind", "simulate"},
                        {"iteration_time_s", 2.0},
                        {"breakdown_s", {{"compute", 1.5}, {"ep_alltoall", 0.5}}},
                        {"busy_s", {{"compute", 1.5}, {"ep_alltoall", 0.7}}},
                        {"memory", {{"peak_gib", 10.0}, {"capacity_gib", 15.0}, {"weights_gib", 6.0}, {"activations_gib", 4.0}}},
                        {"config", {{"pp", 1}, {"tp", 2}, {"ep", 4}, {"dp", 8}, {"micro_batch", 1}}},
                        {"timeline", nlohmann::json::array({{{"lane", "stage 0 compute"}, {"name", "qkv_proj"},
                                                             {"phase", "compute"}, {"start_s", 0.0}, {"duration_s", 0.1}}})}};
  const std::string html = html_report({doc}, {"simulate"});
  EXPECT_EQ(count(html, "data-plot=\"plot"), 3u);  // breakdown, memory, timeline
  EXPECT_NE(html.find("usable device memory 15.0 GiB"), std::string::npos);
  EXPECT_NE(html.find("qkv_proj"), std::string::npos);
}

}  // namespace
}  // namespace tedsim
