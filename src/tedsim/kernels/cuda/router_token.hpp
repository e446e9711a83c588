#pragma once
// One token's work in the CUDA routers (router.cu runs one thread per token over these). Plain
// C++ that nvcc compiles for the device and any C++ compiler for the host, so a CPU test runs the
// very code of the kernels against the CPU router (kernels/cpu/router.hpp, the reference) on
// machines without a GPU. Experts are scanned in index order, so sums run in the CPU's order and
// ties go to the lowest index, as there.
#include <cfloat>
#include <cmath>
#include <cstddef>

#include "tedsim/kernels/cpu/gating.hpp"
#include "tedsim/kernels/cpu/router.hpp"

#if defined(__CUDACC__)
#define TEDSIM_HOST_DEVICE __host__ __device__
#else
#define TEDSIM_HOST_DEVICE
#endif

namespace tedsim::kernels::cuda::router_token {

inline constexpr int kMaxGroups = 64;  // the group limit's open groups are bits of one 64-bit mask

// Keeps the k best (value, index) pairs seen so far, best first; a later index never passes an
// equal value, so the first maximum wins, as the CPU's scan does.
struct TopK {
  float value[kMaxTopK];
  int index[kMaxTopK];
  int filled = 0;
  TEDSIM_HOST_DEVICE void offer(float v, int i, int k) {
    if (filled == k && !(v > value[k - 1])) return;
    int slot = filled < k ? filled++ : k - 1;
    while (slot > 0 && v > value[slot - 1]) {
      value[slot] = value[slot - 1];
      index[slot] = index[slot - 1];
      --slot;
    }
    value[slot] = v;
    index[slot] = i;
  }
};

struct ChooseArgs {
  int experts, k, groups, topk_groups;
  RouterKind kind;
  bool normalize;
};

// Token t's scores (probs: the balance loss's distribution; scores: sigmoid's s, else unused),
// its k experts (group-limited) and their weights before dropping. Returns its first choice.
TEDSIM_HOST_DEVICE inline int choose(const ChooseArgs& a, int t, const float* logits, float* probs, float* scores,
                                     int* expert, float* chosen_weight) {
  const int E = a.experts, k = a.k;
  const std::size_t row = static_cast<std::size_t>(t) * E;
  const float* l = logits + row;
  float* q = probs + row;
  const bool sigmoid = a.kind == RouterKind::sigmoid;
  float* s = sigmoid ? scores + row : nullptr;
  if (sigmoid) {
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) {
      s[e] = 1.0f / (1.0f + expf(-l[e]));
      sum += s[e];
    }
    for (int e = 0; e < E; ++e) q[e] = s[e] / sum;
  } else {
    float m = l[0];
    for (int e = 1; e < E; ++e) m = l[e] > m ? l[e] : m;
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += (q[e] = expf(l[e] - m));
    for (int e = 0; e < E; ++e) q[e] /= sum;
  }
  const float* select = sigmoid ? s : q;  // selection runs on s, or on the probabilities
  // The group limit: a group scores the sum of its best k / topk_groups; the best groups open.
  unsigned long long open = ~0ull;
  const int per_group = E / a.groups;
  if (a.groups > 1) {
    const int take = k / a.topk_groups;
    TopK best_groups;
    for (int g = 0; g < a.groups; ++g) {
      TopK best;
      for (int i = 0; i < per_group; ++i) best.offer(select[g * per_group + i], i, take);
      float sum = 0.0f;
      for (int i = 0; i < take; ++i) sum += select[g * per_group + best.index[i]];
      best_groups.offer(sum, g, a.topk_groups);
    }
    open = 0ull;
    for (int i = 0; i < a.topk_groups; ++i) open |= 1ull << best_groups.index[i];
  }
  TopK chosen;
  for (int e = 0; e < E; ++e)
    if ((open >> (e / per_group)) & 1ull) chosen.offer(select[e], e, k);
  int* ex = expert + static_cast<std::size_t>(t) * k;
  float* w = chosen_weight + static_cast<std::size_t>(t) * k;
  for (int j = 0; j < k; ++j) ex[j] = chosen.index[j];
  if (sigmoid) {
    float total = 0.0f;
    for (int j = 0; j < k; ++j) total += s[ex[j]];
    for (int j = 0; j < k; ++j) w[j] = a.normalize ? s[ex[j]] / (total + 1e-20f) : s[ex[j]];
  } else if (a.kind == RouterKind::topk_softmax) {
    float m = l[ex[0]];
    for (int j = 1; j < k; ++j) m = l[ex[j]] > m ? l[ex[j]] : m;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += (w[j] = expf(l[ex[j]] - m));
    for (int j = 0; j < k; ++j) w[j] /= sum;
  } else {
    for (int j = 0; j < k; ++j) w[j] = q[ex[j]];
  }
  return ex[0];
}

// Token t's weights once positions are known: dropped choices weigh 0; softmax_topk with
// renormalization divides by the kept choices' sum (DeepSpeed's clamp at FLT_EPSILON); times scaling.
TEDSIM_HOST_DEVICE inline void weigh(int t, int k, bool renormalize, float scaling, const int* position,
                                     const float* chosen_weight, float* weight) {
  const std::size_t base = static_cast<std::size_t>(t) * k;
  float kept_sum = 0.0f;
  for (int j = 0; j < k; ++j)
    if (position[base + j] >= 0) kept_sum += chosen_weight[base + j];
  const float denom = kept_sum > FLT_EPSILON ? kept_sum : FLT_EPSILON;
  for (int j = 0; j < k; ++j) {
    const float w = position[base + j] < 0 ? 0.0f : chosen_weight[base + j];
    weight[base + j] = scaling * (renormalize ? w / denom : w);
  }
}

struct BackwardArgs {
  int experts, k, aux_tokens;  // aux_tokens: the balance loss's tokens (a tensor group's under SP)
  RouterKind kind;
  bool normalize;
  float scaling, grad_aux;
};

// Token t's logit gradients (row overwritten) from its weights' gradients and the balance loss's;
// the choices are constants. The [E] temporaries of the CPU loop are recomputed, not stored.
TEDSIM_HOST_DEVICE inline void backward(const BackwardArgs& a, int t, const float* probs, const float* scores,
                                        const int* expert, const int* position, const float* chosen_weight,
                                        const int* top1_count, const float* grad_weight, float* grad_logits) {
  const int E = a.experts, k = a.k, Ta = a.aux_tokens;
  const std::size_t row = static_cast<std::size_t>(t) * E, base = static_cast<std::size_t>(t) * k;
  const float* q = probs + row;
  const int* ex = expert + base;
  const int* pos = position + base;
  const float* w = chosen_weight + base;
  float* gl = grad_logits + row;
  // The balance loss's gradient through q, rounded as the CPU rounds it (double, then float).
  auto aux_term = [&](int e) {
    return static_cast<float>(static_cast<double>(a.grad_aux) * E * (static_cast<double>(top1_count[e]) / Ta) / Ta);
  };
  float gw[kMaxTopK], extra[kMaxTopK];
  for (int j = 0; j < k; ++j) gw[j] = pos[j] < 0 ? 0.0f : a.scaling * grad_weight[base + j];
  // What the chosen weights add to an expert's score gradient (a token's experts are distinct).
  auto plus_chosen = [&](int e, float d) {
    for (int j = 0; j < k; ++j)
      if (ex[j] == e) d += extra[j];
    return d;
  };
  if (a.kind == RouterKind::sigmoid) {
    const float* s = scores + row;
    // q = s / sum(s): dL/ds_e = (dq_e - <dq, q>) / sum(s), then the chosen weights' terms.
    float sum = 0.0f, dot = 0.0f;
    for (int e = 0; e < E; ++e) {
      sum += s[e];
      dot += aux_term(e) * q[e];
    }
    if (a.normalize) {
      float S = 0.0f, gs = 0.0f;
      for (int j = 0; j < k; ++j) {
        S += s[ex[j]];
        gs += gw[j] * s[ex[j]];
      }
      S += 1e-20f;
      for (int j = 0; j < k; ++j) extra[j] = gw[j] / S - gs / (S * S);
    } else {
      for (int j = 0; j < k; ++j) extra[j] = gw[j];
    }
    for (int e = 0; e < E; ++e) gl[e] = plus_chosen(e, (aux_term(e) - dot) / sum) * s[e] * (1.0f - s[e]);
    return;
  }
  for (int j = 0; j < k; ++j) extra[j] = 0.0f;
  if (a.kind == RouterKind::softmax_topk) {
    if (a.normalize) {
      float S = 0.0f, gp = 0.0f;
      for (int j = 0; j < k; ++j) {
        if (pos[j] < 0) continue;
        S += q[ex[j]];
        gp += gw[j] * q[ex[j]];
      }
      const bool clamped = S < FLT_EPSILON;
      const float denom = clamped ? FLT_EPSILON : S;
      for (int j = 0; j < k; ++j)
        if (pos[j] >= 0) extra[j] = gw[j] / denom - (clamped ? 0.0f : gp / (denom * denom));
    } else {
      for (int j = 0; j < k; ++j) extra[j] = gw[j];
    }
  }
  // The softmax's Jacobian: dL/dl_e = q_e (dq_e - <dq, q>).
  float dot = 0.0f;
  for (int e = 0; e < E; ++e) dot += plus_chosen(e, aux_term(e)) * q[e];
  for (int e = 0; e < E; ++e) gl[e] = q[e] * (plus_chosen(e, aux_term(e)) - dot);
  if (a.kind == RouterKind::topk_softmax) {
    // w = softmax over the chosen logits: dL/dl_i = w_i (gw_i - <gw, w>) for each chosen i.
    float gww = 0.0f;
    for (int j = 0; j < k; ++j) gww += gw[j] * w[j];
    for (int j = 0; j < k; ++j) gl[ex[j]] += w[j] * (gw[j] - gww);
  }
}

}  // namespace tedsim::kernels::cuda::router_token
