#include "tedsim/kernels/cpu/router.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>

#include "tedsim/core/error.hpp"

namespace tedsim::kernels {
namespace {

void check_args(int tokens, int experts, const RouterConfig& c) {
  auto bad = [&](const std::string& what) {
    throw InputError("router: " + what + " (T=" + std::to_string(tokens) + " E=" + std::to_string(experts) +
                     " k=" + std::to_string(c.k) + " groups=" + std::to_string(c.groups) + ")");
  };
  if (tokens < 0 || experts <= 0) bad("need tokens >= 0 and experts > 0");
  if (c.k < 1 || c.k > kMaxTopK || c.k > experts) bad("need 1 <= k <= min(" + std::to_string(kMaxTopK) + ", experts)");
  if (c.groups < 1 || experts % c.groups != 0) bad("groups must divide the experts");
  if (c.topk_groups < 1 || c.topk_groups > c.groups) bad("need 1 <= topk_groups <= groups");
  if (c.groups > 1 && (c.k % c.topk_groups != 0 || c.topk_groups * (experts / c.groups) < c.k))
    bad("group-limited routing needs topk_groups to divide k and hold k experts");
}

// The k best of `score` among `allowed` experts, best first; the first maximum wins ties.
void top_k(const float* score, const unsigned char* allowed, int E, int k, std::int32_t* chosen) {
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (!allowed[e]) continue;
      bool taken = false;
      for (int i = 0; i < j; ++i) taken = taken || chosen[i] == e;
      if (taken) continue;
      if (best < 0 || score[e] > score[best]) best = e;
    }
    chosen[j] = best;
  }
}

// Which experts a token may choose: all, or those of its best topk_groups groups.
void allowed_experts(const float* select, int E, const RouterConfig& c, unsigned char* allowed) {
  if (c.groups <= 1) {
    std::fill(allowed, allowed + E, static_cast<unsigned char>(1));
    return;
  }
  const int per_group = E / c.groups, take = c.k / c.topk_groups;
  std::vector<float> group_score(c.groups);
  std::vector<unsigned char> all(per_group, 1);
  std::vector<std::int32_t> best(take);
  for (int g = 0; g < c.groups; ++g) {
    top_k(select + g * per_group, all.data(), per_group, take, best.data());
    float sum = 0.0f;
    for (int i = 0; i < take; ++i) sum += select[g * per_group + best[i]];
    group_score[g] = sum;
  }
  std::vector<unsigned char> every_group(c.groups, 1);
  std::vector<std::int32_t> groups(c.topk_groups);
  top_k(group_score.data(), every_group.data(), c.groups, c.topk_groups, groups.data());
  std::fill(allowed, allowed + E, static_cast<unsigned char>(0));
  for (int g : groups) std::fill(allowed + g * per_group, allowed + (g + 1) * per_group, static_cast<unsigned char>(1));
}

void softmax_row(const float* x, int n, float* y) {
  float m = x[0];
  for (int i = 1; i < n; ++i) m = std::max(m, x[i]);
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += (y[i] = std::exp(x[i] - m));
  for (int i = 0; i < n; ++i) y[i] /= s;
}

}  // namespace

void route_forward(const float* logits, const float* expert_bias, int tokens, int experts, const RouterConfig& cfg,
                   RouterOutput& out) {
  check_args(tokens, experts, cfg);
  const int T = tokens, E = experts, k = cfg.k;
  out.cfg = cfg;
  GatingOutput& g = out.gate;
  g.tokens = T;
  g.aux_tokens = 0;
  g.experts = E;
  g.k = k;
  const std::size_t TE = static_cast<std::size_t>(T) * E, Tk = static_cast<std::size_t>(T) * k;
  g.probs.resize(TE);
  g.expert.resize(Tk);
  g.position.resize(Tk);
  g.weight.resize(Tk);
  g.routed.assign(E, 0);
  g.kept.assign(E, 0);
  g.top1_count.assign(E, 0);
  out.chosen_weight.resize(Tk);
  const bool sigmoid = cfg.kind == RouterKind::sigmoid;
  out.scores.resize(sigmoid ? TE : 0);
  std::vector<float> select(E), chosen_logits(k), chosen_soft(k);
  std::vector<unsigned char> allowed(E);
  for (int t = 0; t < T; ++t) {
    const float* l = logits + static_cast<std::size_t>(t) * E;
    float* q = g.probs.data() + static_cast<std::size_t>(t) * E;
    std::int32_t* ex = g.expert.data() + static_cast<std::size_t>(t) * k;
    float* w = out.chosen_weight.data() + static_cast<std::size_t>(t) * k;
    if (sigmoid) {
      float* s = out.scores.data() + static_cast<std::size_t>(t) * E;
      float sum = 0.0f;
      for (int e = 0; e < E; ++e) {
        s[e] = 1.0f / (1.0f + std::exp(-l[e]));
        sum += s[e];
        select[e] = s[e] + (expert_bias ? expert_bias[e] : 0.0f);
      }
      for (int e = 0; e < E; ++e) q[e] = s[e] / sum;
      allowed_experts(select.data(), E, cfg, allowed.data());
      top_k(select.data(), allowed.data(), E, k, ex);
      float chosen = 0.0f;
      for (int j = 0; j < k; ++j) chosen += s[ex[j]];
      for (int j = 0; j < k; ++j) w[j] = cfg.normalize ? s[ex[j]] / (chosen + 1e-20f) : s[ex[j]];
    } else {
      softmax_row(l, E, q);
      // Selection on the probabilities (monotone in the logits); softmax_topk's weights are them.
      allowed_experts(q, E, cfg, allowed.data());
      top_k(q, allowed.data(), E, k, ex);
      if (cfg.kind == RouterKind::topk_softmax) {
        for (int j = 0; j < k; ++j) chosen_logits[j] = l[ex[j]];
        softmax_row(chosen_logits.data(), k, chosen_soft.data());
        for (int j = 0; j < k; ++j) w[j] = chosen_soft[j];
      } else {
        for (int j = 0; j < k; ++j) w[j] = q[ex[j]];
      }
    }
    ++g.top1_count[ex[0]];
  }
  // Positions, j-major in token order; dropless sizes C to the busiest expert.
  for (std::size_t i = 0; i < Tk; ++i) ++g.routed[g.expert[i]];
  const int busiest = *std::max_element(g.routed.begin(), g.routed.end());
  g.capacity = cfg.drop_tokens ? capacity(T, E, k, cfg.capacity_factor, cfg.min_capacity) : std::max(busiest, 1);
  std::vector<int> next(E, 0);
  for (int j = 0; j < k; ++j)
    for (int t = 0; t < T; ++t) {
      const std::size_t i = static_cast<std::size_t>(t) * k + j;
      const int pos = next[g.expert[i]]++;
      g.position[i] = pos < g.capacity ? pos : -1;
    }
  for (int e = 0; e < E; ++e) g.kept[e] = std::min(g.routed[e], g.capacity);
  // Weights: softmax_topk normalizes over the kept choices (DeepSpeed); the others were normalized
  // over the k chosen before dropping (Megatron-Core).
  for (int t = 0; t < T; ++t) {
    const std::size_t base = static_cast<std::size_t>(t) * k;
    float kept_sum = 0.0f;
    for (int j = 0; j < k; ++j)
      if (g.position[base + j] >= 0) kept_sum += out.chosen_weight[base + j];
    const bool renormalize = cfg.kind == RouterKind::softmax_topk && cfg.normalize;
    const float denom = std::max(kept_sum, FLT_EPSILON);
    for (int j = 0; j < k; ++j) {
      const float w = g.position[base + j] < 0 ? 0.0f : out.chosen_weight[base + j];
      g.weight[base + j] = cfg.scaling * (renormalize ? w / denom : w);
    }
  }
  double aux = 0.0;
  for (int e = 0; e < E; ++e) {
    double mean = 0.0;
    for (int t = 0; t < T; ++t) mean += g.probs[static_cast<std::size_t>(t) * E + e];
    if (T > 0) aux += (mean / T) * (static_cast<double>(g.top1_count[e]) / T);
  }
  g.aux_loss = aux * E;
}

void route_backward(const RouterOutput& fwd, const float* grad_weight, float grad_aux, float* grad_logits) {
  const GatingOutput& g = fwd.gate;
  const RouterConfig& c = fwd.cfg;
  const int T = g.tokens, E = g.experts, k = g.k;
  if (T == 0) return;
  const int Ta = g.aux_tokens > 0 ? g.aux_tokens : T;  // the aux loss's tokens (a group's under SP)
  std::vector<float> aux_term(E), dq(E), dscore(E);
  for (int e = 0; e < E; ++e)
    aux_term[e] = static_cast<float>(static_cast<double>(grad_aux) * E * (static_cast<double>(g.top1_count[e]) / Ta) / Ta);
  for (int t = 0; t < T; ++t) {
    const std::size_t row = static_cast<std::size_t>(t) * E, base = static_cast<std::size_t>(t) * k;
    const float* q = g.probs.data() + row;
    const std::int32_t* ex = g.expert.data() + base;
    const std::int32_t* pos = g.position.data() + base;
    const float* w = fwd.chosen_weight.data() + base;
    float* gl = grad_logits + row;
    // d(loss)/d(chosen weight before scaling); dropped choices contribute nothing.
    float gw[kMaxTopK];
    for (int j = 0; j < k; ++j) gw[j] = pos[j] < 0 ? 0.0f : c.scaling * grad_weight[base + j];
    // The aux loss through q, mapped to the logits below per kind.
    for (int e = 0; e < E; ++e) dq[e] = aux_term[e];
    if (c.kind == RouterKind::sigmoid) {
      const float* s = fwd.scores.data() + row;
      // q = s / sum(s): dL/ds_i = (dq_i - <dq, q>) / sum(s).
      float sum = 0.0f, dot = 0.0f;
      for (int e = 0; e < E; ++e) {
        sum += s[e];
        dot += dq[e] * q[e];
      }
      for (int e = 0; e < E; ++e) dscore[e] = (dq[e] - dot) / sum;
      if (c.normalize) {
        float S = 0.0f, gs = 0.0f;
        for (int j = 0; j < k; ++j) {
          S += s[ex[j]];
          gs += gw[j] * s[ex[j]];
        }
        S += 1e-20f;
        for (int j = 0; j < k; ++j) dscore[ex[j]] += gw[j] / S - gs / (S * S);
      } else {
        for (int j = 0; j < k; ++j) dscore[ex[j]] += gw[j];
      }
      for (int e = 0; e < E; ++e) gl[e] = dscore[e] * s[e] * (1.0f - s[e]);
      continue;
    }
    if (c.kind == RouterKind::softmax_topk) {
      if (c.normalize) {
        float S = 0.0f, gp = 0.0f;
        for (int j = 0; j < k; ++j) {
          if (pos[j] < 0) continue;
          S += q[ex[j]];
          gp += gw[j] * q[ex[j]];
        }
        const bool clamped = S < FLT_EPSILON;
        const float denom = clamped ? FLT_EPSILON : S;
        for (int j = 0; j < k; ++j)
          if (pos[j] >= 0) dq[ex[j]] += gw[j] / denom - (clamped ? 0.0f : gp / (denom * denom));
      } else {
        for (int j = 0; j < k; ++j) dq[ex[j]] += gw[j];
      }
    }
    float dot = 0.0f;
    for (int e = 0; e < E; ++e) dot += dq[e] * q[e];
    for (int e = 0; e < E; ++e) gl[e] = q[e] * (dq[e] - dot);
    if (c.kind == RouterKind::topk_softmax) {
      // w = softmax over the chosen logits: dL/dl_i = w_i (gw_i - <gw, w>) for each chosen i.
      float gww = 0.0f;
      for (int j = 0; j < k; ++j) gww += gw[j] * w[j];
      for (int j = 0; j < k; ++j) gl[ex[j]] += w[j] * (gw[j] - gww);
    }
  }
}

}  // namespace tedsim::kernels
