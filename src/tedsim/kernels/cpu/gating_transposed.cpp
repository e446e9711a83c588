// Gating's pass 1 transposed (AVX2 + FMA) for small expert counts: 8 tokens per group, one ymm per
// expert, so max, top-k, exp and sum are vertical. Why: gating.cpp's header comment.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "tedsim/kernels/cpu/fast_math.hpp"
#include "tedsim/kernels/cpu/gating_passes.hpp"

#if defined(__AVX2__) && defined(__FMA__)

namespace tedsim::kernels::detail {
namespace {

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

// Token t of a group-kernel by the scalar route (tail tokens, NaN groups), then its first
// choice's capacity position in token order, as the group kernels assign first choices.
template <int E>
void scalar_token_first_choice(const float* logits, std::size_t row, int k, int C, std::size_t t, GatingOutput& out,
                               double* prob_sum) {
  std::int32_t unused_top1[E] = {};
  std::int32_t* expert = out.expert.data() + t * k;
  float* weight = out.weight.data() + t * k;
  row_scalar(logits + t * row, row, k, out.probs.data() + t * row, expert, weight, unused_top1, prob_sum);
  const int pos = out.routed[expert[0]]++;
  out.position[t * k] = pos < C ? pos : -1;
  if (pos >= C) weight[0] = 0.0f;
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
    scalar_token_first_choice<E>(logits, row, k, C, t, out, prob_sum);
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
      X[e] = exp_neg256_softmax(_mm256_sub_ps(M[0], X[e]));
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
      const __m256 w1 = _mm256_mul_ps(exp_neg256_softmax(_mm256_sub_ps(M[0], M[1])), inv);
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
        _mm256_store_ps(wj[j], j == 0 ? w0 : _mm256_mul_ps(exp_neg256_softmax(_mm256_sub_ps(M[0], M[j])), inv));
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

// E = 16, k = 1 or 2: one token per row of two ymm (experts 0-7, 8-15), no transposes. Per token:
// max of the two halves, a horizontal max broadcast to all lanes (3 shuffles + 3 max), argmax as
// the lowest set bit of the two equal-to-max masks (ties to the lowest index for free), exp of
// both halves, a horizontal sum and one divide, probs stored row-wise (the row is expert-indexed,
// so the per-expert sums are two vector adds). The first choice's position is assigned here, in
// token order (routed = top1_count afterwards), as in the transposed kernel; pass 2 walks j >= 1.
// k = 2: a tie at the max gives the second lowest set bit; otherwise the max of the row with the
// max lanes at -inf, and its lowest equal lane. A token whose d = max - x has a NaN (NaN logits,
// +inf rows, all -inf rows) goes the scalar route, in token order, before any of its outputs are
// written. Measured against the transposed kernel (same process, alternating, best of 300-1000,
// T = 65536): the same per-token code unpipelined, 2 or 4 tokens per step interleaved in program
// order, 0.93-1.05x (the out-of-order window holds ~3 tokens of a ~95-cycle chain); pipelined
// (below) 1.12-1.2x at k = 1 and k = 2, and the same with the rows L2-resident (T = 2048-4096).
// Without the exponential (22 of the 86 instructions) a token takes 4.9 instead of 8.5 ns.
// Also tried: two tokens per four ymm (one 128-bit half per token), sharing the horizontal max,
// sum and divide: the same speed, as the saved shuffles came back as inserts, constant broadcasts
// and spills (reports/bench-kernels.md).
template <int K>
void pass1_e16(const float* logits, int tokens, GatingOutput& out, double* prob_sum) {
  constexpr int E = 16;
  const int C = out.capacity;
  float* probs = out.probs.data();
  std::int32_t* expert = out.expert.data();
  std::int32_t* position = out.position.data();
  float* weight = out.weight.data();
  std::int32_t* routed = out.routed.data();
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256 one = _mm256_set1_ps(1.0f);
  const std::size_t row = out.experts;  // == E; the runtime value keeps GCC from specializing the scalar route
  auto scalar_token = [&](std::size_t t) {
    scalar_token_first_choice<E>(logits, row, K, C, t, out, prob_sum);
  };
  auto hmax = [](__m256 v) {
    v = _mm256_max_ps(v, _mm256_permute2f128_ps(v, v, 1));
    v = _mm256_max_ps(v, _mm256_permute_ps(v, 0x4E));
    return _mm256_max_ps(v, _mm256_permute_ps(v, 0xB1));
  };
  auto hsum = [](__m256 v) {
    v = _mm256_add_ps(v, _mm256_permute2f128_ps(v, v, 1));
    v = _mm256_add_ps(v, _mm256_permute_ps(v, 0x4E));
    return _mm256_add_ps(v, _mm256_permute_ps(v, 0xB1));
  };
  auto lanes = [](__m256 lo, __m256 hi) {
    return static_cast<unsigned>(_mm256_movemask_ps(lo)) | (static_cast<unsigned>(_mm256_movemask_ps(hi)) << 8);
  };
  // Software pipeline, four stages per token, each on a different token in one loop step: A (t+3)
  // row max; B (t+2) d = max - x, NaN check, argmax (and k = 2's second choice), exponentials;
  // D (t+1) horizontal sum and divide; S (t) store probs, sums, position, weights. A token's whole
  // chain (~95 cycles of latency) would otherwise hold the in-order retirement of ~75 instructions
  // per token; split, each stage waits only on its own ~30-cycle chain.
  struct StB {
    __m256 ea, eb, s;
    int i0, i1;
    bool bad;
  };
  struct StD {
    __m256 ea, eb, inv;
    int i0, i1;
    bool bad;
  };
  auto stage_a = [&](std::size_t t) {
    const float* x = logits + t * E;
    return hmax(_mm256_max_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)));
  };
  auto stage_b = [&](std::size_t t, __m256 m) {
    const float* x = logits + t * E;
    const __m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8);
    const __m256 da = _mm256_sub_ps(m, a), db = _mm256_sub_ps(m, b);
    StB r;
    r.bad = _mm256_movemask_ps(_mm256_cmp_ps(da, db, _CMP_UNORD_Q)) != 0;
    const __m256 eqa = _mm256_cmp_ps(a, m, _CMP_EQ_OQ), eqb = _mm256_cmp_ps(b, m, _CMP_EQ_OQ);
    const unsigned bits = lanes(eqa, eqb);
    r.i0 = static_cast<int>(_tzcnt_u32(bits));
    r.i1 = 0;
    if constexpr (K == 2) {
      const unsigned rest = bits & (bits - 1);  // a tie at the max: its second lowest lane
      const __m256 m1 = hmax(_mm256_max_ps(_mm256_blendv_ps(a, neg_inf, eqa), _mm256_blendv_ps(b, neg_inf, eqb)));
      const unsigned bits1 = lanes(_mm256_cmp_ps(a, m1, _CMP_EQ_OQ), _mm256_cmp_ps(b, m1, _CMP_EQ_OQ));
      r.i1 = static_cast<int>(_tzcnt_u32(rest != 0 ? rest : bits1));
    }
    r.ea = exp_neg256_softmax(da);
    r.eb = exp_neg256_softmax(db);
    r.s = _mm256_add_ps(r.ea, r.eb);
    return r;
  };
  auto stage_d = [&](const StB& b) {
    return StD{b.ea, b.eb, _mm256_div_ps(one, hsum(b.s)), b.i0, b.i1, b.bad};
  };
  auto stage_s = [&](std::size_t t, const StD& d, __m256& acc_a, __m256& acc_b) {
    if (__builtin_expect(d.bad, 0)) {
      scalar_token(t);
      return;
    }
    const __m256 pa = _mm256_mul_ps(d.ea, d.inv), pb = _mm256_mul_ps(d.eb, d.inv);
    float* p = probs + t * E;
    _mm256_storeu_ps(p, pa);
    _mm256_storeu_ps(p + 8, pb);
    acc_a = _mm256_add_ps(acc_a, pa);
    acc_b = _mm256_add_ps(acc_b, pb);
    // First choice: exp(0) is exactly 1, so its probability is inv; position in token order.
    const int pos = routed[d.i0]++;
    const bool keep = pos < C;
    expert[t * K] = d.i0;
    position[t * K] = keep ? pos : -1;
    weight[t * K] = keep ? _mm256_cvtss_f32(d.inv) : 0.0f;
    if constexpr (K == 2) {
      expert[t * 2 + 1] = d.i1;
      weight[t * 2 + 1] = p[d.i1];
    }
  };
  __m256 acc0a = _mm256_setzero_ps(), acc0b = acc0a, acc1a = acc0a, acc1b = acc0a;
  auto flush = [&] {
    alignas(32) float l[4][8];
    _mm256_store_ps(l[0], acc0a);
    _mm256_store_ps(l[1], acc0b);
    _mm256_store_ps(l[2], acc1a);
    _mm256_store_ps(l[3], acc1b);
    acc0a = acc0b = acc1a = acc1b = _mm256_setzero_ps();
    for (int e = 0; e < 8; ++e) {
      prob_sum[e] += static_cast<double>(l[0][e]) + l[2][e];
      prob_sum[8 + e] += static_cast<double>(l[1][e]) + l[3][e];
    }
  };
  std::size_t t0 = 0;
  const std::size_t T = static_cast<std::size_t>(tokens);
  if (T >= 4) {
    StB sb = stage_b(0, stage_a(0));
    StD sd = stage_d(sb);
    sb = stage_b(1, stage_a(1));
    __m256 ma = stage_a(2);
    auto step = [&](std::size_t t, __m256& acc_a, __m256& acc_b) {
      stage_s(t, sd, acc_a, acc_b);
      sd = stage_d(sb);
      sb = stage_b(t + 2, ma);
      ma = stage_a(t + 3);
    };
    // Blocks of kSumBlock tokens (even and odd tokens in separate float sums), then a flush.
    const std::size_t last = T - 3;
    while (t0 < last) {
      const std::size_t end = std::min(last, (t0 / kSumBlock + 1) * kSumBlock);
      for (; t0 + 2 <= end; t0 += 2) {
        step(t0, acc0a, acc0b);
        step(t0 + 1, acc1a, acc1b);
      }
      if (t0 < end) step(t0++, acc0a, acc0b);
      if (t0 % kSumBlock == 0) flush();
    }
    stage_s(t0++, sd, acc0a, acc0b);
    sd = stage_d(sb);
    sb = stage_b(t0 + 1, ma);
    stage_s(t0++, sd, acc1a, acc1b);
    sd = stage_d(sb);
    stage_s(t0++, sd, acc0a, acc0b);
  }
  flush();
  for (; t0 < T; ++t0) scalar_token(t0);
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

}  // namespace

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

void pass1_e16_by_k(const float* logits, int tokens, GatingOutput& out, double* prob_sum) {
  if (out.k == 1) {
    pass1_e16<1>(logits, tokens, out, prob_sum);
  } else {
    pass1_e16<2>(logits, tokens, out, prob_sum);
  }
}

}  // namespace tedsim::kernels::detail

#endif  // __AVX2__ && __FMA__
