// Fused CPU gating. Pass 1 streams the logits once, token by token: max, top-k, exp, normalize,
// per-expert probability sums, and the raw probabilities of the chosen experts. Pass 2 walks only
// the small [T,k] choice arrays to assign capacity positions and finish the combine weights.
//
// Why it looks like this (measured with calibrate/bench_kernels, BM_GatingCpu vs_memcpy):
// - The old single scalar scan did top-k with a data-dependent branch per element (a mispredict
//   every time the running top-k changed) and reached 2-10% of a memcpy of the logits.
// - With AVX2+FMA a row of E <= 64 experts is 1..8 ymm registers: the row is loaded once, max /
//   top-k / exp / sum / normalize all run on registers, and the per-expert probability sums are
//   kept in vectors for a block of tokens. Top-k is branch-free: horizontal max, then a compare
//   mask whose lowest set bit is the lowest index holding the maximum (ties to the lowest index);
//   the j-th choice repeats this with the earlier choices' lanes set to -inf.
//   (AVX-512 would halve the register count, but the build machines are Zen 3: AVX2 only.)
// - Reading the chosen probabilities back for the weights while the row is in L1, instead of
//   gathering them from the [T,E] probs in pass 2, removes T*k cache misses.
// The portable path (no AVX2/FMA, or E > 64) keeps the scalar insertion scan; tests check
// both paths against the fp64 reference.
// - E % 4 == 0 and E <= 32 take the transposed kernel (pass1_avx2_transposed): 8 tokens per group
//   transposed so each ymm holds one expert for the 8 tokens; max / top-k / exp / sum are vertical,
//   the first choices' positions are assigned in pass 1 (token order), top1_count = routed after
//   them, and pass 2 only walks choices j >= 1. E = 16: 3.2 -> ~7 GB/s (vs_memcpy 0.10 -> ~0.22);
//   the remaining cost is the per-group dependency chain (exp -> sum -> divide -> normalize) and
//   FMA-pipe work in exp_neg256, not memory.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cpu/fast_math.hpp"
#include "tedsim/kernels/cpu/gating.hpp"
#include "tedsim/kernels/cpu/gating_common.hpp"
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace tedsim::kernels {

int capacity(std::int64_t tokens, int experts, int k, double factor, int min_capacity) {
  if (experts <= 0 || k <= 0 || tokens < 0 || !(factor >= 0.0) || min_capacity < 0) {
    throw InputError("capacity: need experts > 0, k > 0, tokens >= 0, factor >= 0, min_capacity >= 0 (got E=" +
                     std::to_string(experts) + " k=" + std::to_string(k) + " T=" + std::to_string(tokens) +
                     " f=" + std::to_string(factor) + ")");
  }
  const double exact = static_cast<double>(k) * factor * static_cast<double>(tokens) / experts;
  // A relative guard so that e.g. 1.1*T/E that is an integer in decimal does not ceil one too high.
  const auto c = static_cast<std::int64_t>(std::ceil(exact * (1.0 - 1e-12)));
  return static_cast<int>(std::max<std::int64_t>(c, min_capacity));
}

namespace detail {

void check_gating_args(int tokens, int experts, const GatingConfig& cfg) {
  if (tokens < 0 || experts <= 0 || cfg.k < 1 || cfg.k > kMaxTopK || cfg.k > experts) {
    throw InputError("gating: need tokens >= 0, experts > 0, 1 <= k <= min(" + std::to_string(kMaxTopK) +
                     ", experts) (got T=" + std::to_string(tokens) + " E=" + std::to_string(experts) +
                     " k=" + std::to_string(cfg.k) + ")");
  }
}

void prepare_output(int tokens, int experts, const GatingConfig& cfg, GatingOutput& out) {
  out.tokens = tokens;
  out.experts = experts;
  out.k = cfg.k;
  out.capacity = cfg.drop_tokens ? capacity(tokens, experts, cfg.k, cfg.capacity_factor, cfg.min_capacity)
                                 : std::max(cfg.k * tokens, cfg.min_capacity);
  const auto tk = static_cast<std::size_t>(tokens) * cfg.k;
  out.probs.resize(static_cast<std::size_t>(tokens) * experts);
  out.expert.resize(tk);
  out.position.resize(tk);
  out.weight.resize(tk);
  out.routed.assign(experts, 0);
  out.kept.assign(experts, 0);
  out.top1_count.assign(experts, 0);
}

void assign_positions_and_weights(GatingOutput& out) {
  const int T = out.tokens, k = out.k, C = out.capacity;
  // j-major walk: every token's j-th choice is placed before any (j+1)-th choice.
  for (int j = 0; j < k; ++j) {
    for (int t = 0; t < T; ++t) {
      const std::size_t i = static_cast<std::size_t>(t) * k + j;
      const int e = out.expert[i];
      const int pos = out.routed[e]++;
      if (pos < C) {
        out.position[i] = pos;
        ++out.kept[e];
      } else {
        out.position[i] = -1;
      }
    }
  }
  const std::size_t E = out.experts;
  for (int t = 0; t < T; ++t) {
    const float* p = out.probs.data() + t * E;
    float* w = out.weight.data() + static_cast<std::size_t>(t) * k;
    const std::int32_t* ex = out.expert.data() + static_cast<std::size_t>(t) * k;
    const std::int32_t* pos = out.position.data() + static_cast<std::size_t>(t) * k;
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      w[j] = pos[j] >= 0 ? p[ex[j]] : 0.0f;
      sum += w[j];
    }
    if (k >= 2) {
      const float inv = 1.0f / std::max(sum, FLT_EPSILON);
      for (int j = 0; j < k; ++j) w[j] *= inv;
    }
  }
}

namespace {

// Top-k of one row by insertion: strict '>' keeps the earlier (lower) index ahead on ties. Used by
// the portable path, and by the vector path for rows whose maximum it cannot locate (NaN logits).
inline void topk_scan(const float* x, std::size_t E, int k, float* best_v, int* best_i) {
  int filled = 0;
  // The k-th best so far, kept in a register: reading best_v[k-1] from the stack on every
  // element cost a store-forwarding round trip per comparison.
  float threshold = 0.0f;
  for (std::size_t e = 0; e < E; ++e) {
    const float v = x[e];
    if (filled == k && !(v > threshold)) continue;
    int slot = filled < k ? filled++ : k - 1;
    while (slot > 0 && v > best_v[slot - 1]) {
      best_v[slot] = best_v[slot - 1];
      best_i[slot] = best_i[slot - 1];
      --slot;
    }
    best_v[slot] = v;
    best_i[slot] = static_cast<int>(e);
    threshold = best_v[k - 1];
  }
}

// Pass 2 of the fused kernels. On entry expert[] holds the choices and weight[] the raw softmax
// probability of each choice; routed/kept are zero, or (first_done) the first choices already have
// positions and drops (routed counts them, top1_count is set). Positions in j-major order (all
// j-th choices of all tokens before any (j+1)-th), then drops zeroed and k >= 2 weights
// renormalized.
void assign_positions_fused(GatingOutput& out, bool first_done) {
  const int T = out.tokens, k = out.k, C = out.capacity;
  std::int32_t* routed = out.routed.data();
  const std::int32_t* ex = out.expert.data();
  std::int32_t* position = out.position.data();
  float* weight = out.weight.data();
  for (int j = first_done ? 1 : 0; j < k; ++j) {
    for (int t = 0; t < T; ++t) {
      const std::size_t i = static_cast<std::size_t>(t) * k + j;
      const int pos = routed[ex[i]]++;
      const bool keep = pos < C;
      position[i] = keep ? pos : -1;
      weight[i] = keep ? weight[i] : 0.0f;
    }
  }
  for (int e = 0; e < out.experts; ++e) out.kept[e] = std::min(routed[e], C);
  if (k >= 2) {
    int t = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (k == 2) {
      // 4 tokens per ymm: each lane pair's sum via an in-pair swap, the same sum w0 + w1, clamp,
      // divide and products as the scalar loop (bit-identical).
      const __m256 eps = _mm256_set1_ps(FLT_EPSILON), one = _mm256_set1_ps(1.0f);
      for (; t + 4 <= T; t += 4) {
        float* w = weight + static_cast<std::size_t>(t) * 2;
        const __m256 v = _mm256_loadu_ps(w);
        const __m256 sum = _mm256_add_ps(v, _mm256_permute_ps(v, 0xB1));
        _mm256_storeu_ps(w, _mm256_mul_ps(v, _mm256_div_ps(one, _mm256_max_ps(sum, eps))));
      }
    }
#endif
    for (; t < T; ++t) {
      float* w = weight + static_cast<std::size_t>(t) * k;
      float sum = 0.0f;
      for (int j = 0; j < k; ++j) sum += w[j];
      const float inv = 1.0f / std::max(sum, FLT_EPSILON);
      for (int j = 0; j < k; ++j) w[j] *= inv;
    }
  }
}

double finish_aux(const GatingOutput& out, const double* prob_sum) {
  const int T = out.tokens;
  double aux = 0.0;
  if (T > 0) {
    for (int e = 0; e < out.experts; ++e) {
      aux += (prob_sum[e] / T) * (static_cast<double>(out.top1_count[e]) / T);
    }
  }
  return aux * out.experts;
}

// Per-expert probability sums: float partials over blocks of tokens, flushed into doubles, so the
// inner loop stays vectorized and the mean stays accurate for large T.
constexpr int kSumBlock = 256;

// Portable pass 1 (scalar top-k, exp row via fast_math's AVX2/scalar exp).
void pass1_portable(const float* logits, int tokens, GatingOutput& out, double* prob_sum) {
  const int k = out.k;
  const std::size_t E = out.experts;
  std::vector<float> block_sum(E, 0.0f);
  float* bs = block_sum.data();
  for (int t = 0; t < tokens; ++t) {
    const float* x = logits + t * E;
    float* p = out.probs.data() + t * E;
    float best_v[kMaxTopK] = {};
    int best_i[kMaxTopK] = {};
    topk_scan(x, E, k, best_v, best_i);
    const float m = best_v[0];
    const float s = exp_shifted_row(x, m, p, E);
    const float inv = 1.0f / s;
#pragma omp simd
    for (std::size_t e = 0; e < E; ++e) {
      p[e] *= inv;
      bs[e] += p[e];
    }
    std::int32_t* ex = out.expert.data() + static_cast<std::size_t>(t) * k;
    float* w = out.weight.data() + static_cast<std::size_t>(t) * k;
    for (int j = 0; j < k; ++j) {
      ex[j] = best_i[j];
      w[j] = p[best_i[j]];
    }
    ++out.top1_count[best_i[0]];
    if ((t + 1) % kSumBlock == 0 || t + 1 == tokens) {
      for (std::size_t e = 0; e < E; ++e) {
        prob_sum[e] += bs[e];
        bs[e] = 0.0f;
      }
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)

// exp(v) for v <= 0 (a max-subtracted row): the same range reduction and degree-6 polynomial as
// fast_math.hpp's fast_exp / exp_shifted_row. Only the lower clamp is needed (v <= 0).
inline __m256 exp256(__m256 v) {
  v = _mm256_max_ps(v, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(v, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), v));
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 720.0f), r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// One token by the scalar route, adding its probabilities straight into the fp64 sums: the vector
// kernel's tail tokens (T % 8) and any group with a row whose maximum no lane equals (NaN logits).
void row_scalar(const float* x, std::size_t E, int k, float* p, std::int32_t* ex, float* w, std::int32_t* top1,
                double* prob_sum) {
  float best_v[kMaxTopK] = {};
  int best_i[kMaxTopK] = {};
  topk_scan(x, E, k, best_v, best_i);
  const float inv = 1.0f / exp_shifted_row(x, best_v[0], p, E);
  for (std::size_t e = 0; e < E; ++e) {
    p[e] *= inv;
    prob_sum[e] += p[e];
  }
  for (int j = 0; j < k; ++j) {
    ex[j] = best_i[j];
    w[j] = p[best_i[j]];
  }
  ++top1[best_i[0]];
}

// r[g] = op over the 8 lanes of a[g], for 8 vectors at once: 14 shuffles and 7 ops instead of
// 8 separate horizontal reductions (48 dependent ops).
template <class Op>
inline __m256 reduce8x8(const __m256* a, Op op) {
  __m256 b[4], c[2];
  for (int i = 0; i < 4; ++i) {
    b[i] = op(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x88), _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xDD));
  }
  for (int i = 0; i < 2; ++i) {
    c[i] = op(_mm256_shuffle_ps(b[2 * i], b[2 * i + 1], 0x88), _mm256_shuffle_ps(b[2 * i], b[2 * i + 1], 0xDD));
  }
  return op(_mm256_permute2f128_ps(c[0], c[1], 0x20), _mm256_permute2f128_ps(c[0], c[1], 0x31));
}
inline __m256 max_op(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }
inline __m256 add_op(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
inline __m256 lane_bcast(__m256 v, int g) { return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(g)); }

// Pass 1 for E <= 64 (NC = ceil(E/8) ymm per row) on AVX2+FMA, 8 tokens per group. Per token the
// work is one long dependency chain (max -> compare -> exp polynomial -> sum -> divide -> scale);
// one token at a time left the core waiting on that latency (~20 ns/token at E=16). A group does
// each phase for 8 tokens back to back, so 8 independent chains are in flight, and the horizontal
// max / sum / divide are done once per group, lane g holding token g. K > 0: k known at compile
// time (1, 2); K == 0: any k <= kMaxTopK.
template <int NC, int K>
void pass1_avx2_group(const float* logits, int tokens, GatingOutput& out, double* prob_sum) {
  static_assert(NC >= 1 && NC <= 8, "a row must fit the 64-bit choice mask");
  constexpr int G = 8;
  static_assert(kSumBlock % G == 0, "blocks hold whole groups");
  const int E = out.experts;
  const int k = K > 0 ? K : out.k;
  const int tail = E - 8 * (NC - 1);  // 1..8 lanes in the last chunk of a row
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i tail_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), lane);
  const std::uint64_t valid = E == 64 ? ~0ull : (1ull << E) - 1ull;
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  // Chunk c of a row; lanes past E read as -inf (never the max of a row with a finite entry, and
  // masked out of every comparison and sum).
  auto load = [&](const float* x, int c) {
    if (c < NC - 1 || tail == 8) return _mm256_loadu_ps(x + 8 * c);
    return _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(x + 8 * c, tail_mask), _mm256_castsi256_ps(tail_mask));
  };
  __m256 bs[NC];
  for (int c = 0; c < NC; ++c) bs[c] = _mm256_setzero_ps();
  auto flush = [&] {
    for (int c = 0; c < NC; ++c) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, bs[c]);
      const int n = c == NC - 1 ? tail : 8;
      for (int l = 0; l < n; ++l) prob_sum[8 * c + l] += lanes[l];
      bs[c] = _mm256_setzero_ps();
    }
  };
  float* probs = out.probs.data();
  std::int32_t* expert = out.expert.data();
  float* weight = out.weight.data();
  std::int32_t* top1 = out.top1_count.data();

  int t0 = 0;
  for (; t0 + G <= tokens; t0 += G) {
    const float* x = logits + static_cast<std::size_t>(t0) * E;
    float* p = probs + static_cast<std::size_t>(t0) * E;
    // Top-k. Choice j of token g: max over its lanes not yet chosen (M[j], lane g), then the
    // lowest lane equal to it: ties go to the lowest expert index, as the scalar scan's strict '>'.
    __m256 M[kMaxTopK] = {};
    int chosen[G][kMaxTopK];
    std::uint64_t taken[G] = {};
    bool ok = true;
    for (int j = 0; j < k; ++j) {
      __m256 mx[G];
      for (int g = 0; g < G; ++g) {
        const float* xg = x + static_cast<std::size_t>(g) * E;
        mx[g] = neg_inf;
        for (int c = 0; c < NC; ++c) {
          __m256 v = load(xg, c);
          if (j > 0) {  // lanes of earlier choices -> -inf
            const __m256i lc = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * c));
            __m256i hit = _mm256_setzero_si256();
            for (int q = 0; q < j; ++q) hit = _mm256_or_si256(hit, _mm256_cmpeq_epi32(lc, _mm256_set1_epi32(chosen[g][q])));
            v = _mm256_blendv_ps(v, neg_inf, _mm256_castsi256_ps(hit));
          }
          mx[g] = _mm256_max_ps(mx[g], v);
        }
      }
      M[j] = reduce8x8(mx, max_op);
      for (int g = 0; g < G; ++g) {
        const float* xg = x + static_cast<std::size_t>(g) * E;
        const __m256 mb = lane_bcast(M[j], g);
        std::uint64_t bits = 0;
        for (int c = 0; c < NC; ++c) {
          bits |= static_cast<std::uint64_t>(_mm256_movemask_ps(_mm256_cmp_ps(load(xg, c), mb, _CMP_EQ_OQ))) << (8 * c);
        }
        bits &= valid & ~taken[g];
        ok &= bits != 0;  // no lane equals the max: NaN in the row
        chosen[g][j] = __builtin_ctzll(bits | (1ull << 63));
        taken[g] |= 1ull << chosen[g][j];
      }
    }
    if (!ok) {
      for (int g = 0; g < G; ++g) {
        const std::size_t t = static_cast<std::size_t>(t0) + g;
        row_scalar(logits + t * E, E, k, probs + t * E, expert + t * k, weight + t * k, top1, prob_sum);
      }
    } else {
      // exp(x - max) into p, row sums; one divide for the group.
      __m256 sums[G];
      for (int g = 0; g < G; ++g) {
        const float* xg = x + static_cast<std::size_t>(g) * E;
        float* pg = p + static_cast<std::size_t>(g) * E;
        const __m256 mb = lane_bcast(M[0], g);
        __m256 s = _mm256_setzero_ps();
        for (int c = 0; c < NC; ++c) {
          __m256 y = exp256(_mm256_sub_ps(load(xg, c), mb));
          if (c == NC - 1 && tail != 8) {
            y = _mm256_and_ps(y, _mm256_castsi256_ps(tail_mask));
            _mm256_maskstore_ps(pg + 8 * c, tail_mask, y);
          } else {
            _mm256_storeu_ps(pg + 8 * c, y);
          }
          s = _mm256_add_ps(s, y);
        }
        sums[g] = s;
      }
      const __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), reduce8x8(sums, add_op));
      for (int g = 0; g < G; ++g) {
        float* pg = p + static_cast<std::size_t>(g) * E;
        const __m256 ib = lane_bcast(inv, g);
        for (int c = 0; c < NC; ++c) {
          if (c == NC - 1 && tail != 8) {
            const __m256 y = _mm256_mul_ps(_mm256_maskload_ps(pg + 8 * c, tail_mask), ib);
            _mm256_maskstore_ps(pg + 8 * c, tail_mask, y);
            bs[c] = _mm256_add_ps(bs[c], y);
          } else {
            const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(pg + 8 * c), ib);
            _mm256_storeu_ps(pg + 8 * c, y);
            bs[c] = _mm256_add_ps(bs[c], y);
          }
        }
      }
      // Raw probabilities of the choices, lane g = token g: exp(M[j] - M[0]) * inv, the same
      // lane-wise operations as the chosen lanes of p (bit-identical; exp of 0 is exactly 1),
      // computed here instead of read back from p (a scalar load from a just-stored ymm misses
      // store forwarding).
      std::int32_t* ex = expert + static_cast<std::size_t>(t0) * k;
      float* w = weight + static_cast<std::size_t>(t0) * k;
      if (k == 1) {
        _mm256_storeu_ps(w, inv);
      } else if (k == 2) {
        const __m256 w1 = _mm256_mul_ps(exp256(_mm256_sub_ps(M[1], M[0])), inv);
        const __m256 lo = _mm256_unpacklo_ps(inv, w1), hi = _mm256_unpackhi_ps(inv, w1);
        _mm256_storeu_ps(w, _mm256_permute2f128_ps(lo, hi, 0x20));
        _mm256_storeu_ps(w + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
      } else {
        alignas(32) float wj[kMaxTopK][G];
        _mm256_store_ps(wj[0], inv);
        for (int j = 1; j < k; ++j) _mm256_store_ps(wj[j], _mm256_mul_ps(exp256(_mm256_sub_ps(M[j], M[0])), inv));
        for (int g = 0; g < G; ++g) {
          for (int j = 0; j < k; ++j) w[g * k + j] = wj[j][g];
        }
      }
      for (int g = 0; g < G; ++g) {
        for (int j = 0; j < k; ++j) ex[g * k + j] = chosen[g][j];
        ++top1[chosen[g][0]];
      }
    }
    if ((t0 + G) % kSumBlock == 0) flush();
  }
  flush();
  for (; t0 < tokens; ++t0) {
    const std::size_t t = t0;
    row_scalar(logits + t * E, E, k, probs + t * E, expert + t * k, weight + t * k, top1, prob_sum);
  }
}

// ---- Transposed 8-token kernel for small E (E % 4 == 0, E <= 32) ----
//
// The row kernel above pays per token for horizontal work (reduce8x8 shuffles, lane broadcasts,
// movemask/ctz, scalar stores); at E = 16 that overhead is most of the time. Here a group of 8
// tokens is transposed on load so that vector X[e] holds expert e for the 8 tokens (lane g =
// token g). Max, top-k, exp, sum and normalize are then vertical: no horizontal reduction at all.
// The transpose is done per quad of 4 experts: two 128-bit loads (token i and token i+4) per
// vector and an in-lane 4x4 transpose (8 shuffles per 4 vectors); the same in-lane transpose
// turns the probabilities back into rows, stored as 128-bit halves, and the row-form quads are
// what the per-expert block sums accumulate (one add per 4 tokens per quad).

// Groups of 8 tokens per software-pipelined block of the transposed kernel (scratch: E + 4 ymm per group).
constexpr int kGatingBlockGroups = 4;

// Row store of the transposed kernel's probabilities.
inline void store_row(float* p, __m256 v) { _mm256_storeu_ps(p, v); }  // _mm256_stream_ps measured no faster

// In-lane 4x4 transpose: lane half h of a[i] <- element i of lane half h of a[0..3].
inline void transpose4_lanes(__m256& a0, __m256& a1, __m256& a2, __m256& a3) {
  const __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
  const __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
  a0 = _mm256_shuffle_ps(t0, t2, 0x44);
  a1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  a2 = _mm256_shuffle_ps(t1, t3, 0x44);
  a3 = _mm256_shuffle_ps(t1, t3, 0xEE);
}

// max / sum over v[0..N) as balanced trees: a dependency chain of log2(N) ops, not N.
template <int N>
inline __m256 vmax_tree(const __m256* v) {
  if constexpr (N == 1) {
    return v[0];
  } else {
    return _mm256_max_ps(vmax_tree<N / 2>(v), vmax_tree<N - N / 2>(v + N / 2));
  }
}
template <int N>
inline __m256 vsum_tree(const __m256* v) {
  if constexpr (N == 1) {
    return v[0];
  } else {
    return _mm256_add_ps(vsum_tree<N / 2>(v), vsum_tree<N - N / 2>(v + N / 2));
  }
}

// Lowest e in [0, N) with mask[e] set, as a float (-1 where none): per quad a 4-deep scan (a later
// blend wins, so the scan runs downwards), then the quads combined lowest first. A quad result is
// negative exactly when it found nothing, and blendv selects on the sign bit.
template <int N, class MaskOf>
inline __m256 lowest_set(MaskOf mask_of) {
  constexpr int NQ = (N + 3) / 4;
  __m256 quad[NQ];
#pragma GCC unroll 16
  for (int q = 0; q < NQ; ++q) {
    quad[q] = _mm256_set1_ps(-1.0f);
    for (int e = std::min(N, 4 * q + 4) - 1; e >= 4 * q; --e) {
      quad[q] = _mm256_blendv_ps(quad[q], _mm256_set1_ps(static_cast<float>(e)), mask_of(e));
    }
  }
  // Pairwise: the lower half's answer unless it has none.
  for (int width = 1; width < NQ; width *= 2) {
    for (int q = 0; q + width < NQ; q += 2 * width) quad[q] = _mm256_blendv_ps(quad[q], quad[q + width], quad[q]);
  }
  return quad[0];
}

// Top-2 of X[lo, lo+N) per lane (N even) as a tournament tree, in the order (value descending,
// index ascending) that the scalar insertion scan's strict '>' gives. Merging a lower-index half A
// with a higher-index half B: B's best leads only if strictly greater than A's; the runner-up is
// then the better of A's best and B's second (B's only if strictly greater), else the better of
// A's second and B's best. 11 ops per merge, log2(N) merges deep, no horizontal work.
struct Top2 {
  __m256 m1, m2, i1, i2;
};
template <int N>
inline Top2 top2_tree(const __m256* X, int lo) {
  static_assert(N >= 2 && N % 2 == 0, "pairs at the leaves");
  if constexpr (N == 2) {
    const __m256 a = X[lo], b = X[lo + 1];
    const __m256 ia = _mm256_set1_ps(static_cast<float>(lo)), ib = _mm256_set1_ps(static_cast<float>(lo + 1));
    const __m256 gt = _mm256_cmp_ps(b, a, _CMP_GT_OQ);
    return {_mm256_blendv_ps(a, b, gt), _mm256_blendv_ps(b, a, gt), _mm256_blendv_ps(ia, ib, gt),
            _mm256_blendv_ps(ib, ia, gt)};
  } else {
    constexpr int H = (N / 2) % 2 == 0 ? N / 2 : N / 2 + 1;
    const Top2 A = top2_tree<H>(X, lo), B = top2_tree<N - H>(X, lo + H);
    const __m256 gt = _mm256_cmp_ps(B.m1, A.m1, _CMP_GT_OQ);
    const __m256 g1 = _mm256_cmp_ps(B.m2, A.m1, _CMP_GT_OQ);
    const __m256 g2 = _mm256_cmp_ps(B.m1, A.m2, _CMP_GT_OQ);
    const __m256 m2_if = _mm256_blendv_ps(A.m1, B.m2, g1), i2_if = _mm256_blendv_ps(A.i1, B.i2, g1);
    const __m256 m2_else = _mm256_blendv_ps(A.m2, B.m1, g2), i2_else = _mm256_blendv_ps(A.i2, B.i1, g2);
    return {_mm256_blendv_ps(A.m1, B.m1, gt), _mm256_blendv_ps(m2_else, m2_if, gt), _mm256_blendv_ps(A.i1, B.i1, gt),
            _mm256_blendv_ps(i2_else, i2_if, gt)};
  }
}

// NQ = E / 4 quads of experts; K > 0: k known at compile time, K == 0: any k <= min(E, kMaxTopK).
// Writes probs, expert, weight (raw probability of each choice, 0 for a dropped first choice),
// prob_sum, and the first choices' positions: those are in token order, so they are assigned here
// (routed[] counts them) and pass 2 only walks choices j >= 1. At the end routed[e] is the number
// of tokens whose top-1 choice is e, i.e. top1_count.
template <int NQ, int K>
void pass1_avx2_transposed(const float* logits, int tokens, GatingOutput& out, double* prob_sum) {
  constexpr int E = 4 * NQ;
  constexpr int G = 8;
  static_assert(kSumBlock % (2 * G) == 0, "blocks hold whole double groups");
  const int k = K > 0 ? K : out.k;
  const int C = out.capacity;
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 acc[NQ];
  for (int q = 0; q < NQ; ++q) acc[q] = _mm256_setzero_ps();
  auto flush = [&] {
    for (int q = 0; q < NQ; ++q) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[q]);
      for (int l = 0; l < 4; ++l) prob_sum[4 * q + l] += static_cast<double>(lanes[l]) + lanes[l + 4];
      acc[q] = _mm256_setzero_ps();
    }
  };
  float* probs = out.probs.data();
  std::int32_t* expert = out.expert.data();
  std::int32_t* position = out.position.data();
  float* weight = out.weight.data();
  std::int32_t* routed = out.routed.data();
  // Token t by the scalar route (tail tokens, NaN groups), then its first choice's position.
  const std::size_t row = out.experts;  // == E; the runtime value keeps GCC from specializing the scalar route
  auto scalar_token = [&](std::size_t t) {
    std::int32_t unused_top1[E] = {};
    row_scalar(logits + t * row, row, k, probs + t * row, expert + t * k, weight + t * k, unused_top1, prob_sum);
    const int pos = routed[expert[t * k]]++;
    position[t * k] = pos < C ? pos : -1;
    if (pos >= C) weight[t * k] = 0.0f;
  };
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);

  // Software-pipelined in blocks of NB groups of 8 tokens, two stages over L1-resident scratch:
  // - stage A (per group): load + transpose, top-k, NaN check, exp(x - max), sum, one divide; the
  //   exponentials (still transposed), 1/sum and the choices go to scratch. Nothing in stage A
  //   depends on an earlier group, so the out-of-order core overlaps the groups' long chains
  //   (transpose -> max -> exp -> sum -> divide) instead of stalling on one.
  // - stage B (per group, token order): first choices' positions, normalize, transpose back to
  //   rows, store probs, per-expert sums, weights and experts. Short chains from L1 loads.
  // Measured at E = 16 (best of 300, 2.45 GHz Zen 3 VM, loaded): k = 2 ~960 -> ~880 us (8 -> 4
  // groups per block ~equal; 1 group per block is slower), k = 1 unchanged (~640 us): k = 1 is
  // pipe-bound, not latency-bound (without exp it drops to ~385 us; the FP0/FP1 work of exp_neg256
  // dominates). Tried without gain: streaming probs stores; an integer-min argmax for k = 1
  // (compare | index, vpminud tree) in place of lowest_set's blends (~12% slower).
  constexpr int NB = kGatingBlockGroups;
  constexpr int KS = K > 0 ? K : kMaxTopK;
  struct alignas(32) Scratch {
    __m256 X[NB][E];
    __m256 inv[NB];
    __m256 M[NB][KS], idx[NB][KS];
    bool bad[NB];
  };
  Scratch s;

  auto stage_a = [&](int u, int t0) {
    __m256 X[E];
    {
      const float* x = logits + static_cast<std::size_t>(t0) * E;
#pragma GCC unroll 16
      for (int q = 0; q < NQ; ++q) {
        for (int i = 0; i < 4; ++i) {
          X[4 * q + i] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(x + i * E + 4 * q)),
                                              _mm_loadu_ps(x + (i + 4) * E + 4 * q), 1);
        }
        transpose4_lanes(X[4 * q], X[4 * q + 1], X[4 * q + 2], X[4 * q + 3]);
      }
    }
    // Top-k, choice j in M[j] (value) and idx[j] (expert, as a float), ties to the lowest index.
    // k = 1: max tree, then the lowest expert equal to it. k = 2: tournament tree. k > 2: choice j is
    // the max over the experts not yet chosen, then the lowest such expert equal to it.
    __m256* M = s.M[u];
    __m256* idx = s.idx[u];
    if constexpr (K == 1) {
      M[0] = vmax_tree<E>(X);
      idx[0] = lowest_set<E>([&](int e) { return _mm256_cmp_ps(X[e], M[0], _CMP_EQ_OQ); });
    } else if constexpr (K == 2) {
      const Top2 t2 = top2_tree<E>(X, 0);
      M[0] = t2.m1;
      M[1] = t2.m2;
      idx[0] = t2.i1;
      idx[1] = t2.i2;
    } else {
      M[0] = vmax_tree<E>(X);
      idx[0] = lowest_set<E>([&](int e) { return _mm256_cmp_ps(X[e], M[0], _CMP_EQ_OQ); });
      for (int j = 1; j < k; ++j) {
        auto taken = [&](int e) {
          const __m256 ev = _mm256_set1_ps(static_cast<float>(e));
          __m256 hit = _mm256_cmp_ps(idx[0], ev, _CMP_EQ_OQ);
          for (int q = 1; q < j; ++q) hit = _mm256_or_ps(hit, _mm256_cmp_ps(idx[q], ev, _CMP_EQ_OQ));
          return hit;
        };
        __m256 Y[E];
        for (int e = 0; e < E; ++e) Y[e] = _mm256_blendv_ps(X[e], neg_inf, taken(e));
        M[j] = vmax_tree<E>(Y);
        idx[j] = lowest_set<E>(
            [&](int e) { return _mm256_andnot_ps(taken(e), _mm256_cmp_ps(Y[e], M[j], _CMP_EQ_OQ)); });
      }
    }
    // NaN logits (caught as a NaN sum of the raw logits, which also catches rows holding both +inf
    // and -inf) send the group's tokens the scalar route in stage B, before any of their positions
    // are assigned: the top-k above may not have found a valid expert for them.
    const __m256 raw = vsum_tree<E>(X);
    s.bad[u] = _mm256_movemask_ps(_mm256_cmp_ps(raw, raw, _CMP_UNORD_Q)) != 0;
    // exp(x - max), sum, one divide per group.
#pragma GCC unroll 64
    for (int e = 0; e < E; ++e) {
      X[e] = exp_neg256(_mm256_sub_ps(M[0], X[e]));
      s.X[u][e] = X[e];
    }
    s.inv[u] = _mm256_div_ps(_mm256_set1_ps(1.0f), vsum_tree<E>(X));
  };

  auto stage_b = [&](int u, int t0) {
    if (s.bad[u]) {
      for (int g = 0; g < G; ++g) scalar_token(static_cast<std::size_t>(t0) + g);
      return;
    }
    const __m256 inv = s.inv[u];
    const __m256* M = s.M[u];
    const __m256* idx = s.idx[u];
    // First choices: positions in token order, a bit per dropped token.
    alignas(32) std::int32_t first[G];
    _mm256_store_si256(reinterpret_cast<__m256i*>(first), _mm256_cvtps_epi32(idx[0]));
    unsigned dropped = 0;
    for (int g = 0; g < G; ++g) {
      const int pos = routed[first[g]]++;
      position[static_cast<std::size_t>(t0 + g) * k] = pos < C ? pos : -1;
      dropped |= static_cast<unsigned>(pos >= C) << g;
    }
    const __m256 drop_mask = _mm256_castsi256_ps(
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(dropped)), lane_bit), lane_bit));
    // Normalize, back to rows, store; the row-form quads feed the per-expert sums.
    float* p = probs + static_cast<std::size_t>(t0) * E;
    // a[q][i] = [token i | token i + 4], experts 4q..4q+3. Two quads make 8 experts of a row:
    // one lane permute each for a 256-bit store (the FP store port takes one store per cycle,
    // so halving the store count matters more than the extra permute).
#pragma GCC unroll 16
    for (int q = 0; q < NQ; q += 2) {
      __m256 a[2][4];
      const int nq = q + 1 < NQ ? 2 : 1;
      for (int h = 0; h < nq; ++h) {
        for (int i = 0; i < 4; ++i) a[h][i] = _mm256_mul_ps(s.X[u][4 * (q + h) + i], inv);
        transpose4_lanes(a[h][0], a[h][1], a[h][2], a[h][3]);
        acc[q + h] = _mm256_add_ps(acc[q + h],
                                   _mm256_add_ps(_mm256_add_ps(a[h][0], a[h][1]), _mm256_add_ps(a[h][2], a[h][3])));
      }
      for (int i = 0; i < 4; ++i) {
        if (nq == 2) {
          store_row(p + i * E + 4 * q, _mm256_permute2f128_ps(a[0][i], a[1][i], 0x20));
          store_row(p + (i + 4) * E + 4 * q, _mm256_permute2f128_ps(a[0][i], a[1][i], 0x31));
        } else {  // odd quad count: the last quad as two halves
          _mm_storeu_ps(p + i * E + 4 * q, _mm256_castps256_ps128(a[0][i]));
          _mm_storeu_ps(p + (i + 4) * E + 4 * q, _mm256_extractf128_ps(a[0][i], 1));
        }
      }
    }
    // Choices and their raw probabilities: exp(M[j] - M[0]) * inv is bit-identical to the chosen
    // lane of the normalized row (exp of 0 is exactly 1). Dropped first choices weigh 0.
    const __m256 w0 = _mm256_andnot_ps(drop_mask, inv);
    std::int32_t* ex = expert + static_cast<std::size_t>(t0) * k;
    float* w = weight + static_cast<std::size_t>(t0) * k;
    if (k == 1) {
      _mm256_storeu_ps(w, w0);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(ex), _mm256_cvtps_epi32(idx[0]));
    } else if (k == 2) {
      const __m256 w1 = _mm256_mul_ps(exp_neg256(_mm256_sub_ps(M[0], M[1])), inv);
      const __m256 lo = _mm256_unpacklo_ps(w0, w1), hi = _mm256_unpackhi_ps(w0, w1);
      _mm256_storeu_ps(w, _mm256_permute2f128_ps(lo, hi, 0x20));
      _mm256_storeu_ps(w + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
      const __m256 ilo = _mm256_unpacklo_ps(idx[0], idx[1]), ihi = _mm256_unpackhi_ps(idx[0], idx[1]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(ex), _mm256_cvtps_epi32(_mm256_permute2f128_ps(ilo, ihi, 0x20)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(ex + 8),
                          _mm256_cvtps_epi32(_mm256_permute2f128_ps(ilo, ihi, 0x31)));
    } else {
      alignas(32) float wj[kMaxTopK][G];
      alignas(32) std::int32_t ij[kMaxTopK][G];
      for (int j = 0; j < k; ++j) {
        _mm256_store_ps(wj[j], j == 0 ? w0 : _mm256_mul_ps(exp_neg256(_mm256_sub_ps(M[0], M[j])), inv));
        _mm256_store_si256(reinterpret_cast<__m256i*>(ij[j]), _mm256_cvtps_epi32(idx[j]));
      }
      for (int g = 0; g < G; ++g) {
        for (int j = 0; j < k; ++j) {
          w[g * k + j] = wj[j][g];
          ex[g * k + j] = ij[j][g];
        }
      }
    }
  };

  const int groups = tokens / G;
  for (int b0 = 0; b0 < groups; b0 += NB) {
    const int nb = std::min(NB, groups - b0);
    for (int u = 0; u < nb; ++u) stage_a(u, G * (b0 + u));
    for (int u = 0; u < nb; ++u) {
      const int t0 = G * (b0 + u);
      stage_b(u, t0);
      if ((t0 + G) % kSumBlock == 0) flush();
    }
  }
  int t0 = G * groups;
  flush();
  for (; t0 < tokens; ++t0) scalar_token(static_cast<std::size_t>(t0));
  std::copy(out.routed.begin(), out.routed.end(), out.top1_count.begin());
}

template <int NQ>
void pass1_transposed_k(const float* logits, int tokens, GatingOutput& out, double* prob_sum) {
  switch (out.k) {
    case 1: pass1_avx2_transposed<NQ, 1>(logits, tokens, out, prob_sum); break;
    case 2: pass1_avx2_transposed<NQ, 2>(logits, tokens, out, prob_sum); break;
    default: pass1_avx2_transposed<NQ, 0>(logits, tokens, out, prob_sum); break;
  }
}

// True when the transposed kernel handled this width (E % 4 == 0, E <= 32).
bool pass1_transposed(const float* logits, int tokens, GatingOutput& out, double* prob_sum) {
  if (out.experts % 4 != 0) return false;
  switch (out.experts / 4) {
    case 1: pass1_transposed_k<1>(logits, tokens, out, prob_sum); return true;
    case 2: pass1_transposed_k<2>(logits, tokens, out, prob_sum); return true;
    case 3: pass1_transposed_k<3>(logits, tokens, out, prob_sum); return true;
    case 4: pass1_transposed_k<4>(logits, tokens, out, prob_sum); return true;
    case 5: pass1_transposed_k<5>(logits, tokens, out, prob_sum); return true;
    case 6: pass1_transposed_k<6>(logits, tokens, out, prob_sum); return true;
    case 7: pass1_transposed_k<7>(logits, tokens, out, prob_sum); return true;
    case 8: pass1_transposed_k<8>(logits, tokens, out, prob_sum); return true;
    default: return false;
  }
}

template <int NC>
void pass1_avx2_k(const float* logits, int tokens, GatingOutput& out, double* prob_sum) {
  switch (out.k) {
    case 1: pass1_avx2_group<NC, 1>(logits, tokens, out, prob_sum); break;
    case 2: pass1_avx2_group<NC, 2>(logits, tokens, out, prob_sum); break;
    default: pass1_avx2_group<NC, 0>(logits, tokens, out, prob_sum); break;
  }
}

// True when the register kernel handled this width (E <= 64 experts, at most 8 ymm per row).
bool pass1_vector(const float* logits, int tokens, GatingOutput& out, double* prob_sum) {
  switch ((out.experts + 7) / 8) {
    case 1: pass1_avx2_k<1>(logits, tokens, out, prob_sum); return true;
    case 2: pass1_avx2_k<2>(logits, tokens, out, prob_sum); return true;
    case 3: pass1_avx2_k<3>(logits, tokens, out, prob_sum); return true;
    case 4: pass1_avx2_k<4>(logits, tokens, out, prob_sum); return true;
    case 5: pass1_avx2_k<5>(logits, tokens, out, prob_sum); return true;
    case 6: pass1_avx2_k<6>(logits, tokens, out, prob_sum); return true;
    case 7: pass1_avx2_k<7>(logits, tokens, out, prob_sum); return true;
    case 8: pass1_avx2_k<8>(logits, tokens, out, prob_sum); return true;
    default: return false;
  }
}

#endif  // __AVX2__ && __FMA__

void gating_forward_impl(const float* logits, int tokens, int experts, const GatingConfig& cfg, GatingOutput& out,
                         bool allow_vector) {
  check_gating_args(tokens, experts, cfg);
  prepare_output(tokens, experts, cfg, out);
  std::vector<double> prob_sum(experts, 0.0);
  bool done = false, first_done = false;
#if defined(__AVX2__) && defined(__FMA__)
  if (allow_vector) {
    done = first_done = pass1_transposed(logits, tokens, out, prob_sum.data());
    if (!done) done = pass1_vector(logits, tokens, out, prob_sum.data());
  }
#else
  (void)allow_vector;
#endif
  if (!done) pass1_portable(logits, tokens, out, prob_sum.data());
  assign_positions_fused(out, first_done);
  out.aux_loss = finish_aux(out, prob_sum.data());
}

}  // namespace

void gating_forward_portable(const float* logits, int tokens, int experts, const GatingConfig& cfg,
                             GatingOutput& out) {
  gating_forward_impl(logits, tokens, experts, cfg, out, false);
}

bool gating_has_vector_path(int experts) {
#if defined(__AVX2__) && defined(__FMA__)
  return experts > 0 && experts <= 64;
#else
  (void)experts;
  return false;
#endif
}

}  // namespace detail

void gating_forward(const float* logits, int tokens, int experts, const GatingConfig& cfg, GatingOutput& out) {
  detail::gating_forward_impl(logits, tokens, experts, cfg, out, true);
}

}  // namespace tedsim::kernels
