// Fused CPU gating. Pass 1 streams the logits once, token by token: max, top-k, exp, normalize,
// per-expert probability sums, and the raw probabilities of the chosen experts. Pass 2 walks only
// the small [T,k] choice arrays to assign capacity positions and finish the combine weights.
//
// Why it looks like this (measured with calibrate/bench_kernels, BM_GatingCpu vs_memcpy):
// - The old single scalar scan did top-k with a data-dependent branch per element (a mispredict
//   every time the running top-k changed) and reached 2-10% of a memcpy of the logits.
// - With AVX2+FMA a row of E <= 64 experts is 1..8 ymm registers, handled 8 tokens at a time so
//   the horizontal max / sum / divide are done once per group (pass1_rows). Top-k works on the
//   logits in value passes (each pass takes every lane equal to its maximum, so ties go to the
//   lowest index and cost nothing extra); for k > 2 the passes carry values only and one sweep
//   plus a rank per chosen lane orders the choices. (AVX-512 would halve the register count, but
//   the build machines are Zen 3: AVX2 only.)
// - The row kernel is bound by instruction throughput (~3 instructions per cycle on Zen 3, about
//   270 per token at E = 64, k = 1), a third of it the exponential, hence a degree-4 polynomial
//   for 2^f (exp_neg256_softmax; the earlier row kernel used a degree-6 exp with floor). Against
//   the earlier row kernel, in the same runs: E = 64 k = 1, 2 about 1.3x (with the streaming
//   stores at 16 MiB), k = 8 about 2.4x (value passes).
// - Reading the chosen probabilities back for the weights while the row is in L1, instead of
//   gathering them from the [T,E] probs in pass 2, removes T*k cache misses.
// The portable path (no AVX2/FMA, or E > 64) keeps the scalar insertion scan; tests check
// both paths against the fp64 reference.
// - E % 4 == 0 and E <= 32 take the transposed kernel (pass1_avx2_transposed): 8 tokens per group
//   transposed so each ymm holds one expert for the 8 tokens; max / top-k / exp / sum are vertical,
//   the first choices' positions are assigned in pass 1 (token order), top1_count = routed after
//   them, and pass 2 only walks choices j >= 1. E = 16: 3.2 -> ~7 GB/s (vs_memcpy 0.10 -> ~0.22);
//   ~92 instructions per token at k = 1 (~30 cycles), a third of them the exponential; the row
//   kernel at E = 16 measured slower (12.8 vs 10.7 ns per token at k = 1). E = 16 with k <= 2
//   takes pass1_e16 instead: one token per row of two ymm, software-pipelined over tokens;
//   1.12-1.2x the transposed kernel in the same process (k = 1: 86 instructions per token against
//   91, k = 2: 124 against 125; the gain is the shorter dependency chains, not the count).
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
  out.aux_tokens = 0;
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

// exp(-d) for d >= 0 (d = row max - logit) for the softmax of the row kernel: exp_neg256's range
// reduction with a degree-4 polynomial for 2^f, f in [-1/2, 1/2] (minimax for relative error,
// constant term 1 so exp(-0) is exactly 1). Max relative error 3.6e-6 (exp_neg256: 3.7e-7): a
// probability's relative error stays below ~7.5e-6 (the sum's error partly cancels), inside the
// tests' 1e-5 against the fp64 reference. One FMA fewer per 8 logits than exp_neg256: the gating
// kernels are bound by instruction throughput, and the exponential is about a third of it.
// NaN inputs are not guaranteed to stay NaN (callers check the logits themselves).
inline __m256 exp_neg256_softmax(__m256 d) {
  const __m256 magic = _mm256_set1_ps(12582912.0f), log2e = _mm256_set1_ps(1.44269504088896341f);
  d = _mm256_castsi256_ps(_mm256_min_epi32(_mm256_castps_si256(d), _mm256_castps_si256(_mm256_set1_ps(86.6f))));
  const __m256 u = _mm256_fnmadd_ps(d, log2e, magic);                     // n + 1.5*2^23
  const __m256 f = _mm256_fnmsub_ps(d, log2e, _mm256_sub_ps(u, magic));  // -d*log2e - n
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(0.009782912553463786f), f, _mm256_set1_ps(0.055976883627089156f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.24020711078853738f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.6931136044039088f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  return _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(u), 23)));
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
    case 1: pass1_rows<NC, 1>(logits, tokens, out, prob_sum); break;
    case 2: pass1_rows<NC, 2>(logits, tokens, out, prob_sum); break;
    default: pass1_rows<NC, 0>(logits, tokens, out, prob_sum); break;
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
    if (experts == 16 && cfg.k <= 2) {
      if (cfg.k == 1) {
        pass1_e16<1>(logits, tokens, out, prob_sum.data());
      } else {
        pass1_e16<2>(logits, tokens, out, prob_sum.data());
      }
      done = first_done = true;
    }
    if (!done) done = first_done = pass1_transposed(logits, tokens, out, prob_sum.data());
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
