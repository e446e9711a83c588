#include "tedsim/report/html_ops.hpp"

#include <cstdio>
#include <string>
#include <vector>

#include "tedsim/report/vega_charts.hpp"

namespace tedsim {
namespace {

using json = nlohmann::json;

// Every op kind in one order, so a kind keeps its colour.
const std::vector<std::string> kOpKinds = {"gemm",     "attention",    "all_reduce", "all_gather", "reduce_scatter",
                                           "all_to_all", "all_to_all_v", "send_recv",  "gating",     "dispatch",
                                           "combine",  "layernorm",    "activation", "softmax",    "elementwise",
                                           "adam",     "other"};

std::string fmt(double v, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  return buf;
}

std::string shape_text(const json& op) {
  if (!op.contains("shape")) return "";
  const json& s = op["shape"];
  std::string t = std::to_string(s.value("m", 0)) + "x" + std::to_string(s.value("n", 0)) + "x" +
                  std::to_string(s.value("k", 0));
  if (s.value("batch", 1) > 1) t += " x" + std::to_string(s.value("batch", 1));
  return t;
}

// TFLOP/s of a GEMM (the attention core's over the causal half it computes), GB/s of the bytes a
// memory-bound kernel or a collective moves.
std::string rate_text(const json& op) {
  const double s = op.value("seconds", 0.0);
  if (s <= 0) return "";
  const std::string kind = op.value("kind", "");
  if (op.contains("flops")) return fmt((kind == "attention" ? 0.5 : 1.0) * op["flops"].get<double>() / s / 1e12, 1) + " TFLOP/s";
  if (op.contains("bytes")) return fmt(op["bytes"].get<double>() / s / 1e9, 1) + " GB/s";
  return "";
}

}  // namespace

void ops_section(HtmlPage& page, const json& ops) {
  if (!ops.is_array() || ops.empty()) return;
  json rows = json::array();
  std::vector<std::vector<std::string>> table;
  for (const json& block : ops) {
    const std::string name = block.value("block", "");
    const int count = block.value("count", 1);
    const std::string bar = name + (count > 1 ? " (x" + std::to_string(count) + ")" : "");
    const json passes = block.value("passes", json::object());  // a copy: items() of a temporary would dangle
    double block_s = 0;
    for (const auto& [pass, content] : passes.items()) block_s += content.value("seconds", 0.0);
    for (const auto& [pass, content] : passes.items()) {
      const json pass_ops = content.value("ops", json::array());
      for (const json& op : pass_ops) {
        const double s = op.value("seconds", 0.0);
        if (s > 0) rows.push_back({{"bar", bar}, {"part", op.value("kind", "other")}, {"value", 1e3 * s * count}});
        const std::string amount = op.contains("flops")   ? fmt(op["flops"].get<double>() / 1e9, 2) + " GFLOP"
                                   : op.contains("bytes") ? fmt(op["bytes"].get<double>() / 1e6, 2) + " MB"
                                                          : "";
        table.push_back({name, pass, op.value("name", ""), op.value("kind", ""), op.value("phase", ""), fmt(1e6 * s, 1),
                         block_s > 0 ? fmt(100 * s / block_s, 1) : "", amount, rate_text(op), shape_text(op)});
      }
    }
  }
  if (rows.empty()) return;
  page.heading("Op by op", 3);
  StackedBars options;
  options.value_title = "time per micro-batch on one rank (ms)";
  options.bar_title = "block (times the model runs it)";
  options.part_title = "op kind";
  options.colour_domain = kOpKinds;
  page.plot(stacked_bars_chart(rows, options),
            "Where a micro-batch's time goes, by layer kind and op kind: each block's forward, recompute and backward "
            "times the layers that run it.");
  page.table({"block", "pass", "op", "kind", "phase", "time us", "share of block %", "amount", "rate", "shape m x n x k"},
             table,
             "Every op of each block, one rank and micro-batch (simulate --ops prints the same). Attention rates count "
             "the causal half the kernel computes.");
}

}  // namespace tedsim
