#include "kernel_times.hpp"

#include <cstring>
#include <map>
#include <ostream>
#include <string>

#include "tedsim/report/text_table.hpp"

namespace tedsim::cli {
namespace {

constexpr const char* kNotPriced = "not priced";

// The kind of work a StepOps kernel does, in the words of the table.
const char* step_kernel_kind(const std::string& name) {
  static const std::map<std::string, const char*> kinds = {
      {"gemm", "GEMMs"},
      {"attention_forward", "attention core"},
      {"attention_backward", "attention core"},
      {"split_heads", "layout copies"},
      {"merge_heads_grad", "layout copies"},
      {"heads_to_tokens", "layout copies"},
      {"tokens_to_heads", "layout copies"},
      {"copy_rows", "layout copies"},
      {"layernorm_forward", "norms"},
      {"layernorm_backward", "norms"},
      {"rmsnorm_forward", "norms"},
      {"rmsnorm_backward", "norms"},
      {"rotary_forward", "residuals and element-wise"},
      {"rotary_backward", "residuals and element-wise"},
      {"gelu_forward", "activations"},
      {"gelu_backward", "activations"},
      {"swiglu_forward", "activations"},
      {"swiglu_backward", "activations"},
      {"gating_forward", "router"},
      {"route_forward", "router"},
      {"gating_backward", "router"},
      {"aux_loss", "router"},
      {"dispatch", "dispatch and combine"},
      {"dispatch_backward", "dispatch and combine"},
      {"combine", "dispatch and combine"},
      {"combine_backward", "dispatch and combine"},
      {"add_into", "residuals and element-wise"},
      {"embedding_forward", "embedding"},
      {"embedding_backward", "embedding"},
      {"ce_max_and_target", "loss"},
      {"ce_exp_and_sum", "loss"},
      {"ce_gradient", "loss"},
      {"adam_step", "optimizer"},
  };
  const auto it = kinds.find(name);
  return it == kinds.end() ? kNotPriced : it->second;
}

bool starts_with(const char* s, const char* prefix) { return std::strncmp(s, prefix, std::strlen(prefix)) == 0; }

// The same kinds for the workload's ops; nullptr for a collective (the phase table's business).
const char* op_kind(const Op& op) {
  const char* n = op.name;
  if (op.is_collective) return nullptr;
  // The host's launch waits are no kernel: on the device they are idle time, and in the measured
  // table they sit inside each call's own time (a fenced call waits for its launch). A row of
  // their own keeps them out of the element-wise row, which they had tripled (device run 5).
  if (op.phase == Phase::host_launch) return "host launch waits (inside each measured call)";
  if (op.is_attention || starts_with(n, "attn_scores") || starts_with(n, "attn_softmax") ||
      starts_with(n, "attn_context") || starts_with(n, "attn_dropout"))
    return "attention core";
  if (starts_with(n, "attn_split_heads") || starts_with(n, "attn_merge_heads") || starts_with(n, "expert_major_") ||
      starts_with(n, "dtd_slice") || starts_with(n, "dtd_unslice"))
    return "layout copies";
  if (starts_with(n, "embedding_")) return "embedding";
  if (starts_with(n, "cross_entropy")) return "loss";
  if (op.flops > 0) return "GEMMs";
  switch (op.kernel) {
    case KernelKind::layernorm: return "norms";
    case KernelKind::activation: return "activations";
    case KernelKind::gating: return "router";
    case KernelKind::dispatch:
    case KernelKind::combine: return "dispatch and combine";
    case KernelKind::adam: return "optimizer";
    case KernelKind::cross_entropy: return "loss";
    case KernelKind::softmax:
    case KernelKind::elementwise:
    case KernelKind::count: break;
  }
  return "residuals and element-wise";
}

std::map<std::string, const char*> kinds_by_op_name(const Workload& w) {
  std::map<std::string, const char*> kinds;
  for (const Block* b : w.blocks())
    for (int i = 0; i < b->count; ++i) kinds.emplace(b->ops[i].name, op_kind(b->ops[i]));
  return kinds;
}

std::string ms(double s) { return fixed(s * 1e3, 3); }

}  // namespace

void print_kernel_times(std::ostream& out, const runtime::KernelCensus& census, double steps,
                        const TraceRecorder& predicted, const Workload& workload) {
  struct Row {
    double predicted_s = 0, measured_s = 0, calls = 0;
  };
  std::map<std::string, Row> rows;
  for (const auto& [name, k] : census.kernels) {
    // Each kernel the workload does not price gets a row of its own, so a user sees what it is.
    const char* kind = step_kernel_kind(name);
    Row& r = rows[kind == kNotPriced ? std::string(kNotPriced) + ": " + name : std::string(kind)];
    r.measured_s += k.seconds / steps;
    r.calls += double(k.calls) / steps;
  }
  const auto kinds = kinds_by_op_name(workload);
  for (const TraceEvent& e : predicted.events()) {
    if (e.stage != 0) continue;  // rank 0 runs stage 0
    const auto it = kinds.find(e.name);
    const char* kind = it != kinds.end() ? it->second : (e.phase == Phase::optimizer ? "optimizer" : nullptr);
    if (kind) rows[kind].predicted_s += e.duration_s;
  }
  double predicted_total = 0, measured_total = 0;
  TextTable table({"kernels (rank 0)", "calls", "predicted ms", "measured ms", "error"});
  for (const auto& [kind, r] : rows) {
    const bool priced = kind.rfind(kNotPriced, 0) != 0;
    predicted_total += r.predicted_s;
    measured_total += r.measured_s;
    const std::string error = !priced || r.measured_s <= 0
                                  ? std::string("-")
                                  : (r.predicted_s >= r.measured_s ? "+" : "") +
                                        fixed(100.0 * (r.predicted_s - r.measured_s) / r.measured_s, 1) + "%";
    table.add_row({kind, fixed(r.calls, 0), priced ? ms(r.predicted_s) : std::string("-"), ms(r.measured_s), error});
  }
  table.add_row({"all kernels", "", ms(predicted_total), ms(measured_total),
                 measured_total > 0 ? std::string(predicted_total >= measured_total ? "+" : "") +
                                          fixed(100.0 * (predicted_total - measured_total) / measured_total, 1) + "%"
                                    : "-"});
  out << "\nkernel times per iteration (calls timed one by one over " << fixed(steps, 0)
      << " steps, warm-up included; the prediction's ops of rank 0's stage; collectives are in the phase table)\n";
  table.print(out);
}

}  // namespace tedsim::cli
