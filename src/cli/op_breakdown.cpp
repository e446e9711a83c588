#include "op_breakdown.hpp"

#include <string>
#include <vector>

#include "tedsim/report/text_table.hpp"

namespace tedsim::cli {
namespace {

struct NamedBlocks {
  std::string name;
  int count = 0;  // how many of the model's layers run this block (modules for MTP; 1 for the ends)
  std::vector<std::pair<const char*, const Block*>> passes;
};

// The blocks the model runs, with how many layers use each.
std::vector<NamedBlocks> blocks_of(const Workload& w, const ModelSpec& model) {
  int dense = 0, moe = 0, dense_window = 0, moe_window = 0;
  for (int layer = 0; layer < model.layers; ++layer) {
    const bool window = w.windowed && model.is_window_layer(layer);
    (model.is_moe_layer(layer) ? (window ? moe_window : moe) : (window ? dense_window : dense)) += 1;
  }
  auto layer_blocks = [](const std::string& name, int count, const LayerBlocks& b) {
    return NamedBlocks{name, count, {{"forward", &b.forward}, {"recompute", &b.recompute}, {"backward", &b.backward}}};
  };
  std::vector<NamedBlocks> out;
  out.push_back({"embedding", 1, {{"forward", &w.embedding_forward}, {"backward", &w.embedding_backward}}});
  if (dense > 0) out.push_back(layer_blocks("dense layer", dense, w.dense));
  if (dense_window > 0) out.push_back(layer_blocks("dense layer, windowed", dense_window, w.dense_window));
  if (moe > 0) out.push_back(layer_blocks("MoE layer", moe, w.moe));
  if (moe_window > 0) out.push_back(layer_blocks("MoE layer, windowed", moe_window, w.moe_window));
  if (model.mtp_layers > 0) out.push_back({"MTP module", model.mtp_layers, {{"forward", &w.mtp_forward}, {"backward", &w.mtp_backward}}});
  out.push_back({"head and loss", 1, {{"forward", &w.head_forward}, {"backward", &w.head_backward}}});
  return out;
}

const char* op_kind(const Op& op) {
  if (op.is_collective) return to_string(op.collective);
  if (op.is_attention) return "attention";
  if (op.flops > 0) return "gemm";
  if (op.kernel != KernelKind::count) return to_string(op.kernel);
  return "other";
}

// What the op's time implies: TFLOP/s for GEMMs and the attention core, GB/s of bytes moved for
// memory-bound kernels, algorithm bandwidth (the per-rank buffer over the time) for collectives.
// The attention core's FLOPs count the whole score square, as a GEMM count does; its rate counts
// the causal half a fused kernel computes, as FlashAttention's and cuDNN's figures do.
std::string rate(const Op& op) {
  if (op.seconds <= 0) return "";
  if (op.is_attention) return fixed(0.5 * op.flops / op.seconds / 1e12, 1) + " TFLOP/s";
  if (op.flops > 0 && !op.is_collective) return fixed(op.flops / op.seconds / 1e12, 1) + " TFLOP/s";
  if (op.bytes > 0) return fixed(op.bytes / op.seconds / 1e9, 1) + " GB/s";
  return "";
}

std::string amount(const Op& op) {
  if (op.flops > 0 && !op.is_collective) return fixed(op.flops / 1e9, 2) + " GFLOP";
  if (op.bytes > 0) return fixed(op.bytes / 1e6, 2) + " MB";
  return "";
}

std::string gemm_shape(const Op& op) {
  if (op.is_collective || op.flops <= 0 || op.gemm.m <= 0) return "";
  const GemmShape& g = op.gemm;
  std::string s = std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k);
  if (g.batch > 1) s += " x" + std::to_string(g.batch);
  if (g.dtype == Dtype::fp8) s += " fp8";
  return s;
}

}  // namespace

void print_op_breakdown(std::ostream& out, const Workload& w, const ModelSpec& model) {
  out << "ops per rank and micro-batch (one of each block; 'layers' says how many the model runs; shape m x n x k"
         " [x batch]; attention: seq x v_head x qk_head x heads, its rate over the causal half it computes)\n";
  for (const NamedBlocks& nb : blocks_of(w, model)) {
    double total = 0;
    for (const auto& [pass, block] : nb.passes) total += block->seconds;
    out << '\n' << nb.name << " (" << nb.count << (nb.count == 1 ? "" : " of them") << "): " << human_seconds(total)
        << " per micro-batch\n";
    TextTable table({"pass", "op", "kind", "phase", "time", "share", "amount", "rate", "shape"});
    for (const auto& [pass, block] : nb.passes) {
      for (int i = 0; i < block->count; ++i) {
        const Op& op = block->ops[i];
        table.add_row({pass, op.name, op_kind(op), to_string(op.phase), human_seconds(op.seconds),
                       total > 0 ? fixed(100 * op.seconds / total, 1) + "%" : "", amount(op), rate(op), gemm_shape(op)});
      }
    }
    table.print(out);
  }
  out << '\n';
}

nlohmann::json op_breakdown_json(const Workload& w, const ModelSpec& model) {
  nlohmann::json blocks = nlohmann::json::array();
  for (const NamedBlocks& nb : blocks_of(w, model)) {
    nlohmann::json passes = nlohmann::json::object();
    for (const auto& [pass, block] : nb.passes) {
      nlohmann::json ops = nlohmann::json::array();
      for (int i = 0; i < block->count; ++i) {
        const Op& op = block->ops[i];
        nlohmann::json j = {{"name", op.name}, {"kind", op_kind(op)}, {"phase", to_string(op.phase)}, {"seconds", op.seconds}};
        if (op.flops > 0 && !op.is_collective) j["flops"] = op.flops;
        if (op.bytes > 0) j["bytes"] = op.bytes;
        // The framework calls the host issues for it in eager mode (model/host_launch.hpp), and
        // whether the host then waits for it (a device-to-host sync).
        j["host_calls"] = op.host_calls + op.host_resume_calls;
        if (op.host_sync) j["host_sync"] = true;
        if (op.flops > 0 && !op.is_collective && op.gemm.m > 0)
          j["shape"] = {{"m", op.gemm.m}, {"n", op.gemm.n}, {"k", op.gemm.k}, {"batch", op.gemm.batch}};
        ops.push_back(std::move(j));
      }
      passes[pass] = {{"seconds", block->seconds}, {"ops", std::move(ops)}};
    }
    blocks.push_back({{"block", nb.name}, {"count", nb.count}, {"passes", std::move(passes)}});
  }
  return blocks;
}

}  // namespace tedsim::cli
