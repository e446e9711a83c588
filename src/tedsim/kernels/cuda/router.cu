// Today's routers on the device (cpu/router.hpp is the reference and states the semantics), one
// thread per token over router_token.hpp's functions (which a CPU test also runs):
//  1. choose: scores, the group limit, the top k, the weights before dropping, top-1 counts;
//  2. positions in the experts' buffers (moe.cu's j-major prefix count); dropless reads the routed
//     counts back and sizes the buffer to the busiest expert;
//  3. weights after dropping (softmax_topk renormalizes over the kept choices);
//  4. the balance loss (moe.cu).
#include <cfloat>
#include <climits>
#include <string>
#include <vector>

#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/router_token.hpp"
#include "tedsim/kernels/cuda/routing_common.hpp"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::cuda {

namespace {

namespace tok = router_token;

__global__ void choose_kernel(tok::ChooseArgs a, int tokens, const float* logits, float* probs, float* scores,
                              int* expert, float* chosen_weight, int* top1_count) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  atomicAdd(&top1_count[tok::choose(a, t, logits, probs, scores, expert, chosen_weight)], 1);
}

__global__ void weights_kernel(int tokens, int k, bool renormalize, float scaling, const int* position,
                               const float* chosen_weight, float* weight) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < tokens) tok::weigh(t, k, renormalize, scaling, position, chosen_weight, weight);
}

__global__ void backward_kernel(tok::BackwardArgs a, int tokens, const float* probs, const float* scores,
                                const int* expert, const int* position, const float* chosen_weight,
                                const int* top1_count, const float* grad_weight, float* grad_logits) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < tokens)
    tok::backward(a, t, probs, scores, expert, position, chosen_weight, top1_count, grad_weight, grad_logits);
}

void check_router_args(int tokens, int experts, const RouterConfig& c) {
  auto bad = [&](const std::string& what) {
    throw InputError("cuda::route_forward: " + what + " (T=" + std::to_string(tokens) + " E=" + std::to_string(experts) +
                     " k=" + std::to_string(c.k) + " groups=" + std::to_string(c.groups) + ")");
  };
  if (tokens < 0 || experts <= 0) bad("need tokens >= 0 and experts > 0");
  if (c.k < 1 || c.k > kMaxTopK || c.k > experts) bad("need 1 <= k <= min(" + std::to_string(kMaxTopK) + ", experts)");
  if (c.groups < 1 || c.groups > tok::kMaxGroups || experts % c.groups != 0)
    bad("groups must divide the experts and be at most " + std::to_string(tok::kMaxGroups));
  if (c.topk_groups < 1 || c.topk_groups > c.groups) bad("need 1 <= topk_groups <= groups");
  if (c.groups > 1 && (c.k % c.topk_groups != 0 || c.topk_groups * (experts / c.groups) < c.k))
    bad("group-limited routing needs topk_groups to divide k and hold k experts");
}

}  // namespace

void route_forward(const float* logits, int tokens, int experts, const RouterConfig& cfg, DeviceRouter& out) {
  check_router_args(tokens, experts, cfg);
  const int k = cfg.k;
  DeviceGating& g = out.gate;
  const std::size_t tk = static_cast<std::size_t>(tokens) * k, te = static_cast<std::size_t>(tokens) * experts;
  const bool sigmoid = cfg.kind == RouterKind::sigmoid;
  // (Re)allocate only when the shape changes, so a timing loop measures the kernels alone.
  if (g.tokens != tokens || g.experts != experts || g.k != k || g.probs.bytes() == 0) {
    g.probs = DeviceBuffer(te * sizeof(float) + 4);
    g.expert = DeviceBuffer(tk * sizeof(int) + 4);
    g.position = DeviceBuffer(tk * sizeof(int) + 4);
    g.weight = DeviceBuffer(tk * sizeof(float) + 4);
    g.routed = DeviceBuffer(experts * sizeof(int));
    g.kept = DeviceBuffer(experts * sizeof(int));
    g.top1_count = DeviceBuffer(experts * sizeof(int));
    g.prob_sum = DeviceBuffer(experts * sizeof(float));
    g.aux_loss = DeviceBuffer(sizeof(float));
    out.chosen_weight = DeviceBuffer(tk * sizeof(float) + 4);
    out.scores = DeviceBuffer();
  }
  if (sigmoid && out.scores.bytes() < te * sizeof(float) + 4) out.scores = DeviceBuffer(te * sizeof(float) + 4);
  out.cfg = cfg;
  g.tokens = tokens;
  g.experts = experts;
  g.k = k;
  g.aux_tokens = 0;
  TEDSIM_CUDA_CHECK(cudaMemsetAsync(g.top1_count.data(), 0, g.top1_count.bytes()));
  TEDSIM_CUDA_CHECK(cudaMemsetAsync(g.aux_loss.data(), 0, g.aux_loss.bytes()));
  const unsigned blocks = static_cast<unsigned>((tokens + 127) / 128);
  if (tokens > 0) {
    const tok::ChooseArgs a{experts, k, cfg.groups, cfg.topk_groups, cfg.kind, cfg.normalize};
    choose_kernel<<<blocks, 128>>>(a, tokens, logits, g.probs.as<float>(), sigmoid ? out.scores.as<float>() : nullptr,
                                   g.expert.as<int>(), out.chosen_weight.as<float>(), g.top1_count.as<int>());
    TEDSIM_CUDA_CHECK_LAUNCH();
  }
  if (cfg.drop_tokens) {
    g.capacity = capacity(tokens, experts, k, cfg.capacity_factor, cfg.min_capacity);
    detail::launch_choice_positions(g.expert.as<int>(), tokens, k, experts, g.capacity, g.position.as<int>(),
                                    g.routed.as<int>(), g.kept.as<int>());
  } else {
    // Dropless: nothing is dropped, so the positions need no capacity; the buffer's is the busiest
    // expert's count, read back now (the host sizes the dispatch buffer from it).
    detail::launch_choice_positions(g.expert.as<int>(), tokens, k, experts, INT_MAX, g.position.as<int>(),
                                    g.routed.as<int>(), g.kept.as<int>());
    std::vector<int> routed(static_cast<std::size_t>(experts));
    g.routed.download(routed.data(), routed.size() * sizeof(int));
    int busiest = 1;
    for (int n : routed) busiest = n > busiest ? n : busiest;
    g.capacity = busiest;
  }
  if (tokens > 0) {
    const bool renormalize = cfg.kind == RouterKind::softmax_topk && cfg.normalize;
    weights_kernel<<<blocks, 128>>>(tokens, k, renormalize, cfg.scaling, g.position.as<int>(),
                                    out.chosen_weight.as<float>(), g.weight.as<float>());
    TEDSIM_CUDA_CHECK_LAUNCH();
  }
  detail::launch_balance_loss(g.probs.as<float>(), g.top1_count.as<int>(), tokens, experts, g.prob_sum.as<float>(),
                              g.aux_loss.as<float>());
}

void route_backward(const DeviceRouter& fwd, const float* grad_weight, float grad_aux, float* grad_logits) {
  const DeviceGating& g = fwd.gate;
  if (g.tokens <= 0 || g.experts <= 0) return;
  const RouterConfig& c = fwd.cfg;
  const int aux_tokens = g.aux_tokens > 0 ? g.aux_tokens : g.tokens;
  const tok::BackwardArgs a{g.experts, g.k, aux_tokens, c.kind, c.normalize, c.scaling, grad_aux};
  backward_kernel<<<static_cast<unsigned>((g.tokens + 127) / 128), 128>>>(
      a, g.tokens, g.probs.as<float>(), c.kind == RouterKind::sigmoid ? fwd.scores.as<float>() : nullptr, g.expert.as<int>(),
      g.position.as<int>(), fwd.chosen_weight.as<float>(), g.top1_count.as<int>(), grad_weight, grad_logits);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void DeviceRouter::download(RouterOutput& out) const {
  out.cfg = cfg;
  gate.download(out.gate);
  out.gate.aux_tokens = gate.aux_tokens;
  const std::size_t tk = static_cast<std::size_t>(gate.tokens) * gate.k;
  const std::size_t te = static_cast<std::size_t>(gate.tokens) * gate.experts;
  out.chosen_weight.resize(tk);
  if (tk > 0) chosen_weight.download(out.chosen_weight.data(), tk * sizeof(float));
  const bool sigmoid = cfg.kind == RouterKind::sigmoid;
  out.scores.resize(sigmoid ? te : 0);
  if (sigmoid && te > 0) scores.download(out.scores.data(), te * sizeof(float));
}

}  // namespace tedsim::kernels::cuda
