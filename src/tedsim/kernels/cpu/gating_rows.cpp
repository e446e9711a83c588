// Gating's pass 1 by rows (AVX2 + FMA): 8 tokens per group, each row in 1..8 ymm registers. Why it
// looks like this: gating.cpp's header comment.
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

namespace {

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

// Pass 1 for E <= 64 (NC = ceil(E/8) ymm per row) on AVX2+FMA, 8 tokens per group, rows kept in
// row form (8 experts per vector). Per token the work is one long dependency chain (max -> exp ->
// sum -> divide -> scale); a group runs each phase for 8 tokens back to back so 8 chains are in
// flight, and the horizontal max / sum / divide are done once per group (reduce8x8, lane g =
// token g). Per-token values are broadcast from L1 scratch (a load, not a lane permute).
//
// Top-k works on the logits in passes, each pass taking every lane equal to the pass's maximum:
// pass j compares the row against M_j (>=), its movemask minus the lanes of earlier passes is the
// set equal to M_j, taken in index order (ties to the lowest index); the same compare blends those
// lanes to -inf, and their max is M_{j+1}, the largest value below M_j. So pass j costs 4 ops per
// vector (compare, movemask, blend, max) and no per-lane index bookkeeping; pass 0 rides along
// with the exponentials (the row is loaded once for both), and ties fill several choices at once.
//
// NaN logits: a NaN d = max - x (NaN logit, or +inf - +inf) makes the row's sum NaN (folded in as
// min(0, sum of d)); such a group goes the scalar route before any of its outputs are written.
template <int NC>
struct alignas(32) RowScratch {
  float y[8][8 * NC];              // exp(x - max) of the group's rows, normalized into probs
  float m[kMaxTopK][8];            // pass j's maximum, lane g = token g (m[0]: the row max)
  float inv[8];                    // 1 / row sum
  float cval[kMaxTopK][8];         // logit of choice j of token g
  std::int32_t cidx[kMaxTopK][8];  // expert of choice j of token g
  float wj[kMaxTopK][8];           // raw probability of choice j of token g
  float bs[8 * NC];                // per-expert probability sums of the current block
};


// Probabilities of the row kernel to [T,E]. When probs is far larger than the caches, streaming
// stores skip the read-for-ownership of every destination line: measured 1.15-1.3x faster at
// T=65536, E=64 (16 MiB), no gain at 4 MiB (where probs stay in L3 for the backward), so only
// above kStreamBytes. Two 16-byte halves: std::vector guarantees 16-byte alignment, not 32.
// (Software prefetch of the logits, or prefetchw of the probs a few groups ahead, gained nothing.)
constexpr std::size_t kStreamBytes = std::size_t{8} << 20;
inline void store_probs(float* p, __m256 v, bool stream) {
  if (stream) {
    _mm_stream_ps(p, _mm256_castps256_ps128(v));
    _mm_stream_ps(p + 4, _mm256_extractf128_ps(v, 1));
  } else {
    _mm256_storeu_ps(p, v);
  }
}

// probs rows of a group = scratch exponentials * 1/sum. Row by row, so the [T,E] stores run
// sequentially (chunk-major order interleaved 8 rows and left the core waiting on write misses);
// the per-expert block sums stay in registers for the group.
template <int NC, class Scratch>
inline void normalize_rows(Scratch& s, float* p, int E, int tail, __m256i tail_mask, bool stream) {
  __m256 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm256_load_ps(s.bs + 8 * c);
  for (int g = 0; g < 8; ++g) {
    const __m256 inv = _mm256_broadcast_ss(&s.inv[g]);
    float* row = p + static_cast<std::size_t>(g) * E;
    for (int c = 0; c < NC; ++c) {
      const __m256 y = _mm256_mul_ps(_mm256_load_ps(s.y[g] + 8 * c), inv);
      if (c == NC - 1 && tail != 8) {
        _mm256_maskstore_ps(row + 8 * c, tail_mask, y);
      } else {
        store_probs(row + 8 * c, y, stream);
      }
      acc[c] = _mm256_add_ps(acc[c], y);
    }
  }
  for (int c = 0; c < NC; ++c) _mm256_store_ps(s.bs + 8 * c, acc[c]);
}

// 8x8 transpose of rows r[0..8): r[i] lane j <- r[j] lane i.
inline void transpose8x8(__m256* r) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// Experts and raw probabilities of a group's choices into the [T,k] arrays. The probability of
// choice j is exp(M_0 - its logit) / sum, the same lane-wise operations as its lane of the probs
// row (bit-identical; exp of 0 is exactly 1, so choice 0 weighs 1/sum).
template <class Scratch>
inline void write_choices(Scratch& s, int k, __m256 inv, std::int32_t* ex, float* w) {
  const __m256 m0 = _mm256_load_ps(s.m[0]);
  _mm256_store_ps(s.wj[0], inv);
  for (int j = 1; j < k; ++j) {
    const __m256 e = exp_neg256_softmax(_mm256_sub_ps(m0, _mm256_load_ps(s.cval[j])));
    _mm256_store_ps(s.wj[j], _mm256_mul_ps(e, inv));
  }
  if (k == 1) {
    _mm256_storeu_ps(w, inv);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ex), _mm256_load_si256(reinterpret_cast<const __m256i*>(s.cidx[0])));
    return;
  }
  if (k == 2) {  // interleave choice 0 and 1 of the 8 tokens
    const __m256 w0 = inv, w1 = _mm256_load_ps(s.wj[1]);
    const __m256 c0 = _mm256_load_ps(reinterpret_cast<const float*>(s.cidx[0]));
    const __m256 c1 = _mm256_load_ps(reinterpret_cast<const float*>(s.cidx[1]));
    const __m256 wl = _mm256_unpacklo_ps(w0, w1), wh = _mm256_unpackhi_ps(w0, w1);
    const __m256 cl = _mm256_unpacklo_ps(c0, c1), ch = _mm256_unpackhi_ps(c0, c1);
    _mm256_storeu_ps(w, _mm256_permute2f128_ps(wl, wh, 0x20));
    _mm256_storeu_ps(w + 8, _mm256_permute2f128_ps(wl, wh, 0x31));
    _mm256_storeu_ps(reinterpret_cast<float*>(ex), _mm256_permute2f128_ps(cl, ch, 0x20));
    _mm256_storeu_ps(reinterpret_cast<float*>(ex + 8), _mm256_permute2f128_ps(cl, ch, 0x31));
    return;
  }
  if (k == 8) {  // [choice][token] -> [token][choice]: two transposes, 16 vector stores
    __m256 wr[8], cr[8];
    for (int j = 0; j < 8; ++j) {
      wr[j] = _mm256_load_ps(s.wj[j]);
      cr[j] = _mm256_load_ps(reinterpret_cast<const float*>(s.cidx[j]));
    }
    transpose8x8(wr);
    transpose8x8(cr);
    for (int g = 0; g < 8; ++g) {
      _mm256_storeu_ps(w + 8 * g, wr[g]);
      _mm256_storeu_ps(reinterpret_cast<float*>(ex + 8 * g), cr[g]);
    }
    return;
  }
  for (int g = 0; g < 8; ++g) {
    for (int j = 0; j < k; ++j) {
      w[g * k + j] = s.wj[j][g];
      ex[g * k + j] = s.cidx[j][g];
    }
  }
}

// Top-k for k > 2 of a group whose pass 0 is done (below[g]: token g's lane-wise max of the lanes
// below M_0). Value-only passes find the distinct values M_1 > M_2 > ... > M_{k-1} (3 ops per
// vector: compare, blend, max; no masks), then one sweep takes the lanes >= M_{k-1}, and each of
// those is ranked by its value against the M_j (one vector compare and a popcount), so the choices
// come out ordered by value and, within a value, by index. M_j stays -inf once the row runs out
// of distinct values.
template <class Scratch, class Load>
inline void select_by_values(Scratch& s, int k, __m256* below, const float* x, int E, Load load,
                             std::uint64_t valid) {
  constexpr int NC = sizeof(s.bs) / sizeof(float) / 8;
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int j = 1; j < k; ++j) {
    _mm256_store_ps(s.m[j], reduce8x8(below, max_op));
    if (j + 1 == k) break;
    for (int g = 0; g < 8; ++g) {
      const float* xg = x + static_cast<std::size_t>(g) * E;
      const __m256 mb = _mm256_broadcast_ss(&s.m[j][g]);
      __m256 b = neg_inf;
      for (int c = 0; c < NC; ++c) {
        const __m256 v = load(xg, c);
        b = _mm256_max_ps(b, _mm256_blendv_ps(v, neg_inf, _mm256_cmp_ps(v, mb, _CMP_GE_OQ)));
      }
      below[g] = b;
    }
  }
  // Token g's M_0..M_7 as one vector (M_j = -inf for j >= k, never above a lane): a transpose,
  // not 8 scalar stores and a vector reload (a store-forwarding stall per token).
  __m256 mcol[8];
  for (int j = 0; j < 8; ++j) mcol[j] = j < k ? _mm256_load_ps(s.m[j]) : neg_inf;
  transpose8x8(mcol);
  for (int g = 0; g < 8; ++g) {
    const float* xg = x + static_cast<std::size_t>(g) * E;
    const __m256 mb = _mm256_broadcast_ss(&s.m[k - 1][g]);
    std::uint64_t bits = 0;
    for (int c = 0; c < NC; ++c) {
      bits |= static_cast<std::uint64_t>(_mm256_movemask_ps(_mm256_cmp_ps(load(xg, c), mb, _CMP_GE_OQ))) << (8 * c);
    }
    bits &= valid;
    const __m256 mv = mcol[g];
    const float* mt = &s.m[0][g];  // mt[8 * j] = M_j
    // Rank of lane e: how many of the distinct M_j lie above its value.
    auto rank = [&](int e) {
      return __builtin_popcount(_mm256_movemask_ps(_mm256_cmp_ps(mv, _mm256_broadcast_ss(xg + e), _CMP_GT_OQ)));
    };
    if (__builtin_popcountll(bits) == k && mt[8 * (k - 1)] > -std::numeric_limits<float>::infinity()) {
      // k distinct values, one lane each: the rank is the choice.
      for (; bits != 0; bits &= bits - 1) {
        const int e = __builtin_ctzll(bits), r = rank(e);
        s.cidx[r][g] = e;
        s.cval[r][g] = mt[8 * r];
      }
      continue;
    }
    // Ties: lanes of rank r fill the slots after all lanes of lower rank, in index order.
    int start[kMaxTopK + 1] = {};
    for (std::uint64_t b = bits; b != 0; b &= b - 1) ++start[rank(__builtin_ctzll(b)) + 1];
    for (int r = 0; r < kMaxTopK; ++r) start[r + 1] += start[r];
    for (; bits != 0; bits &= bits - 1) {
      const int e = __builtin_ctzll(bits), r = rank(e), slot = start[r]++;
      if (slot < k) {
        s.cidx[slot][g] = e;
        s.cval[slot][g] = mt[8 * r];
      }
    }
  }
}

template <int NC, int K>
void pass1_rows(const float* logits, int tokens, GatingOutput& out, double* prob_sum) {
  static_assert(NC >= 1 && NC <= 8, "a row must fit the 64-bit lane masks");
  constexpr int G = 8;
  static_assert(kSumBlock % G == 0, "blocks hold whole groups");
  const int E = out.experts;
  const int k = K > 0 ? K : out.k;
  const int tail = E - 8 * (NC - 1);  // 1..8 lanes in the last chunk of a row
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i tail_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), lane);
  const std::uint64_t valid = E == 64 ? ~0ull : (1ull << E) - 1ull;
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256 zero = _mm256_setzero_ps();
  // Chunk c of a row; lanes past E read as -inf (never above a valid lane; masked out of every
  // choice and sum).
  auto load = [&](const float* x, int c) {
    if (c < NC - 1 || tail == 8) return _mm256_loadu_ps(x + 8 * c);
    return _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(x + 8 * c, tail_mask), _mm256_castsi256_ps(tail_mask));
  };
  RowScratch<NC> s;
  for (int c = 0; c < NC; ++c) _mm256_store_ps(s.bs + 8 * c, zero);
  auto flush = [&] {
    for (int e = 0; e < E; ++e) prob_sum[e] += s.bs[e];
    for (int c = 0; c < NC; ++c) _mm256_store_ps(s.bs + 8 * c, zero);
  };
  float* probs = out.probs.data();
  std::int32_t* expert = out.expert.data();
  float* weight = out.weight.data();
  std::int32_t* top1 = out.top1_count.data();
  const bool stream = out.probs.size() * sizeof(float) > kStreamBytes && E % 4 == 0 &&
                      reinterpret_cast<std::uintptr_t>(probs) % 16 == 0;

  std::uint64_t seen[G];  // k = 2: lanes of pass 0 (all lanes equal to M_0)
  int filled[G];          // choices found per token
  __m256 below_max[G];    // per token: lane-wise max of the lanes below M_0
  // Pass j's lanes of token g, in index order, until the token has k choices.
  auto take = [&](int g, std::uint64_t bits, int j) {
    for (; bits != 0 && filled[g] < k; bits &= bits - 1) {
      s.cidx[filled[g]][g] = __builtin_ctzll(bits);
      s.cval[filled[g]][g] = s.m[j][g];
      ++filled[g];
    }
  };

  const float* x = logits;  // the current group's rows
  // k = 2, pass 1 for the tokens whose pass 0 took a single lane: the lanes equal to M_1, the
  // largest value below M_0 (lane-wise in below_max), lowest index first.
  auto second_choices = [&] {
    _mm256_store_ps(s.m[1], reduce8x8(below_max, max_op));
    for (int g = 0; g < G; ++g) {
      if (filled[g] >= 2) continue;
      const float* xg = x + static_cast<std::size_t>(g) * E;
      const __m256 mb = _mm256_broadcast_ss(&s.m[1][g]);
      std::uint64_t bits = 0;
      for (int c = 0; c < NC; ++c) {
        bits |= static_cast<std::uint64_t>(_mm256_movemask_ps(_mm256_cmp_ps(load(xg, c), mb, _CMP_GE_OQ))) << (8 * c);
      }
      take(g, bits & valid & ~seen[g], 1);
    }
  };

  int t0 = 0;
  for (; t0 + G <= tokens; t0 += G) {
    x = logits + static_cast<std::size_t>(t0) * E;
    // Row maxima.
    __m256 part[G];
    for (int g = 0; g < G; ++g) {
      const float* xg = x + static_cast<std::size_t>(g) * E;
      __m256 m = load(xg, 0);
      for (int c = 1; c < NC; ++c) m = _mm256_max_ps(m, load(xg, c));
      part[g] = m;
    }
    _mm256_store_ps(s.m[0], reduce8x8(part, max_op));
    // exp(x - max) into scratch, row sums (part[g]), top-k pass 0 (below_max[g]: lane-wise max of
    // the lanes below M_0).
    for (int g = 0; g < G; ++g) {
      const float* xg = x + static_cast<std::size_t>(g) * E;
      const __m256 mb = _mm256_broadcast_ss(&s.m[0][g]);
      __m256 sum = zero, dsum = zero, below = neg_inf;
      std::uint64_t bits = 0;
      for (int c = 0; c < NC; ++c) {
        const __m256 v = load(xg, c);
        const __m256 d = _mm256_sub_ps(mb, v);
        __m256 y = exp_neg256_softmax(d);
        if (c == NC - 1 && tail != 8) y = _mm256_and_ps(y, _mm256_castsi256_ps(tail_mask));
        _mm256_store_ps(s.y[g] + 8 * c, y);
        sum = _mm256_add_ps(sum, y);
        dsum = _mm256_add_ps(dsum, d);
        const __m256 top = _mm256_cmp_ps(v, mb, _CMP_GE_OQ);
        if (K != 0) bits |= static_cast<std::uint64_t>(_mm256_movemask_ps(top)) << (8 * c);
        if (K != 1) below = _mm256_max_ps(below, _mm256_blendv_ps(v, neg_inf, top));
      }
      // d >= 0 or +inf unless NaN: min(0, dsum) is +0 (sum unchanged) or NaN.
      part[g] = _mm256_add_ps(sum, _mm256_min_ps(zero, dsum));
      bits &= valid;
      below_max[g] = below;
      if (K == 1) {
        s.cidx[0][g] = __builtin_ctzll(bits | (1ull << 63));
        s.cval[0][g] = s.m[0][g];
      } else if (K == 2) {
        seen[g] = bits;
        filled[g] = 0;
        take(g, bits, 0);
      }
    }
    const __m256 total = reduce8x8(part, add_op);
    if (_mm256_movemask_ps(_mm256_cmp_ps(total, total, _CMP_UNORD_Q)) != 0) {
      for (int g = 0; g < G; ++g) {
        const std::size_t t = static_cast<std::size_t>(t0) + g;
        row_scalar(logits + t * E, E, k, probs + t * E, expert + t * k, weight + t * k, top1, prob_sum);
      }
      if ((t0 + G) % kSumBlock == 0) flush();
      continue;
    }
    const __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), total);
    _mm256_store_ps(s.inv, inv);
    normalize_rows<NC>(s, probs + static_cast<std::size_t>(t0) * E, E, tail, tail_mask, stream);
    if (K == 0) {
      select_by_values(s, k, below_max, x, E, load, valid);
    } else if (K == 2) {
      second_choices();
    }
    write_choices(s, k, inv, expert + static_cast<std::size_t>(t0) * k, weight + static_cast<std::size_t>(t0) * k);
    for (int g = 0; g < G; ++g) ++top1[s.cidx[0][g]];
    if ((t0 + G) % kSumBlock == 0) flush();
  }
  flush();
  if (stream) _mm_sfence();  // order the streamed rows before anything that follows
  for (; t0 < tokens; ++t0) {
    const std::size_t t = t0;
    row_scalar(logits + t * E, E, k, probs + t * E, expert + t * k, weight + t * k, top1, prob_sum);
  }
}
template <int NC>
void pass1_avx2_k(const float* logits, int tokens, GatingOutput& out, double* prob_sum) {
  switch (out.k) {
    case 1: pass1_rows<NC, 1>(logits, tokens, out, prob_sum); break;
    case 2: pass1_rows<NC, 2>(logits, tokens, out, prob_sum); break;
    default: pass1_rows<NC, 0>(logits, tokens, out, prob_sum); break;
  }
}

}  // namespace

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

}  // namespace tedsim::kernels::detail

#endif  // __AVX2__ && __FMA__
