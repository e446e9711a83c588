// Every function of cuda/step_kernels.hpp against its CPU reference on random inputs of several
// sizes (including sizes that are not multiples of a warp). References: the CPU kernels where one
// exists, otherwise plain loops written here after the trainer's CPU code (head layouts,
// embedding, cross-entropy). Outputs the contract says are overwritten start from garbage on the
// device, so a kernel that skips an entry fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cpu/activations.hpp"
#include "tedsim/kernels/cpu/attention.hpp"
#include "tedsim/kernels/cpu/bf16.hpp"
#include "tedsim/kernels/cpu/cross_entropy.hpp"
#include "tedsim/kernels/cpu/dispatch.hpp"
#include "tedsim/kernels/cpu/gating.hpp"
#include "tedsim/kernels/cpu/gemm.hpp"
#include "tedsim/kernels/cpu/layernorm.hpp"
#include "tedsim/kernels/cpu/rmsnorm.hpp"
#include "tedsim/kernels/cpu/rotary.hpp"
#include "tedsim/kernels/cuda/cuda_kernels.hpp"
#include "tedsim/kernels/cuda/step_kernels.hpp"
#include "tedsim/kernels/device.hpp"
#include "gpu_device_arrays.hpp"
#include "gpu_test_support.hpp"

namespace tedsim::kernels {
namespace {

namespace cu = tedsim::kernels::cuda;

using GpuStep = gpu_test::Gpu;

using gpu_test::random_vector;
using gpu_test::kGarbage;
using gpu_test::DevF;
using gpu_test::DevI;
using gpu_test::expect_close;
using gpu_test::expect_close_to_max;
using gpu_test::max_abs;

std::vector<std::int32_t> random_ids(std::size_t n, unsigned seed, int lo, int hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// ---------------------------------------------------------------- memory and element-wise

TEST_F(GpuStep, MallocCopyFillAddScale) {
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{4099}}) {
    const auto a = random_vector(n, 1), y0 = random_vector(n, 2);
    const std::size_t bytes = n * sizeof(float);
    float* d_a = static_cast<float*>(cu::device_malloc(bytes));
    float* d_b = static_cast<float*>(cu::device_malloc(bytes));
    float* d_y = static_cast<float*>(cu::device_malloc(bytes));
    ASSERT_NE(d_a, nullptr);
    cu::copy(d_a, a.data(), bytes);  // host -> device
    cu::copy(d_b, d_a, bytes);       // device -> device
    std::vector<float> back(n);
    cu::copy(back.data(), d_b, bytes);  // device -> host
    EXPECT_EQ(back, a);

    cu::copy(d_y, y0.data(), bytes);
    cu::add_into(n, d_a, d_y);
    cu::synchronize();
    cu::copy(back.data(), d_y, bytes);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], y0[i] + a[i]) << "add_into " << i;
    cu::scale(n, -0.375f, d_y);
    cu::synchronize();
    cu::copy(back.data(), d_y, bytes);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], (y0[i] + a[i]) * -0.375f) << "scale " << i;

    // fill_zero of all but the last element.
    cu::fill_zero(d_y, bytes - sizeof(float));
    cu::synchronize();
    cu::copy(back.data(), d_y, bytes);
    for (std::size_t i = 0; i + 1 < n; ++i) ASSERT_EQ(back[i], 0.0f) << "fill_zero " << i;
    EXPECT_EQ(back[n - 1], (y0[n - 1] + a[n - 1]) * -0.375f) << "fill_zero past its range";

    cu::device_free(d_a);
    cu::device_free(d_b);
    cu::device_free(d_y);
  }
  cu::device_free(nullptr);
  cu::add_into(0, nullptr, nullptr);
  cu::scale(0, 2.0f, nullptr);
  cu::fill_zero(nullptr, 0);
  cu::synchronize();
}

TEST_F(GpuStep, MallocFailureThrowsAndLeavesNoStaleError) {
  EXPECT_THROW(cu::device_malloc(std::size_t{1} << 56), RunError);
  DevF y(std::vector<float>{1.0f, 2.0f, 3.0f});
  EXPECT_NO_THROW(cu::scale(3, 2.0f, y.ptr()));  // the launch check must not see the failed malloc
  EXPECT_EQ(y.host(), (std::vector<float>{2.0f, 4.0f, 6.0f}));
}

TEST_F(GpuStep, Copy2dMovesRowsBetweenPitches) {
  struct Case {
    int rows, src_pitch, dst_pitch, width;  // in floats
  };
  for (Case c : {Case{5, 40, 20, 17}, Case{33, 7, 9, 7}, Case{1, 3, 3, 3}}) {
    const auto src = random_vector(static_cast<std::size_t>(c.rows) * c.src_pitch, 3);
    const auto dst0 = random_vector(static_cast<std::size_t>(c.rows) * c.dst_pitch, 4);
    DevF d_src(src), d_dst(dst0);
    cu::copy_2d(d_dst.ptr(), c.dst_pitch * sizeof(float), d_src.ptr(), c.src_pitch * sizeof(float),
                c.width * sizeof(float), c.rows);
    std::vector<float> ref = dst0;
    for (int r = 0; r < c.rows; ++r)
      for (int x = 0; x < c.width; ++x)
        ref[static_cast<std::size_t>(r) * c.dst_pitch + x] = src[static_cast<std::size_t>(r) * c.src_pitch + x];
    EXPECT_EQ(d_dst.host(), ref) << c.rows << " rows of " << c.width;
  }
}

// ---------------------------------------------------------------- GEMM

TEST_F(GpuStep, ConvertRowsToBf16RoundsLikeTheCpu) {
  // Four columns at a time where columns, leading dimension and alignment allow (37x300, 3x1000,
  // 16x64), one at a time elsewhere (33 columns; a source one float off 16-byte alignment).
  struct Case {
    int rows, cols, ld, offset;
  };
  for (Case c : {Case{1, 1, 1, 0}, Case{37, 300, 300, 0}, Case{64, 33, 40, 0}, Case{3, 1000, 1024, 0},
                 Case{16, 64, 64, 0}, Case{16, 64, 64, 1}}) {
    auto src = random_vector(static_cast<std::size_t>(c.rows) * c.ld + c.offset, 21, -3, 3);
    // Ties and edges: 1 + 2^-8 (a tie to the even 1), 1 + 3 * 2^-8 (a tie to the even 1 + 2^-6).
    src[c.offset] = 1.0f + std::ldexp(1.0f, -8);
    const std::size_t at = static_cast<std::size_t>(c.offset);
    if (src.size() > 1 + at) src[1 + at] = 1.0f + std::ldexp(3.0f, -8);
    if (src.size() > 2 + at) src[2 + at] = std::numeric_limits<float>::infinity();
    if (src.size() > 3 + at) src[3 + at] = -std::numeric_limits<float>::max();  // rounds to -inf
    DevF d_src(src);
    gpu_test::Dev<std::uint16_t> d_dst(static_cast<std::size_t>(c.rows) * c.cols, 0xdeadu);
    cu::convert_rows_to_bf16(c.rows, c.cols, d_src.ptr() + c.offset, c.ld, d_dst.ptr());
    const std::vector<std::uint16_t> got = d_dst.host();
    for (int r = 0; r < c.rows; ++r) {
      for (int x = 0; x < c.cols; ++x) {
        const float want = round_to_bf16(src[static_cast<std::size_t>(r) * c.ld + x + c.offset]);
        std::uint32_t want_bits;
        std::memcpy(&want_bits, &want, sizeof want_bits);
        ASSERT_EQ(got[static_cast<std::size_t>(r) * c.cols + x], want_bits >> 16)
            << c.rows << "x" << c.cols << " ld " << c.ld << " at " << r << "," << x;
      }
    }
  }
}

TEST_F(GpuStep, GemmBf16ComputeMatchesCpuGemmOnBf16Operands) {  // and gemm_bf16_compute_rounded_b
  cu::BlasHandle handle;
  struct Shape {
    int m, n, k, pad;  // pad: extra columns of leading dimension on A and B
  };
  for (Shape s : {Shape{64, 256, 64, 0}, Shape{7, 33, 5, 0}, Shape{130, 77, 300, 0}, Shape{48, 96, 80, 5},
                  Shape{3, 2, 0, 0}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, 0.5f}) {
          const GemmOp op{ta == 1, tb == 1, 1.25f, beta};
          const int a_rows = ta ? s.k : s.m, a_cols = (ta ? s.m : s.k) + s.pad;
          const int b_rows = tb ? s.n : s.k, b_cols = (tb ? s.k : s.n) + s.pad;
          const auto a = random_vector(static_cast<std::size_t>(a_rows) * a_cols, 5);
          const auto b = random_vector(static_cast<std::size_t>(b_rows) * b_cols, 6);
          const auto c0 = random_vector(static_cast<std::size_t>(s.m) * s.n, 7);
          // The reference multiplies the bf16-rounded operands in fp32: what is left is the order of
          // fp32 accumulation, so the tolerance is fp32's, not bf16's.
          std::vector<float> a16 = a, b16 = b;
          for (float& x : a16) x = round_to_bf16(x);
          for (float& x : b16) x = round_to_bf16(x);
          std::vector<float> ref = c0;
          gemm(op, s.m, s.n, s.k, a16.data(), a_cols, b16.data(), b_cols, ref.data(), s.n);
          DevF da(a), db(b), dc(c0);
          cu::gemm_bf16_compute(handle, op, s.m, s.n, s.k, da.ptr(), a_cols, db.ptr(), b_cols, dc.ptr(), s.n);
          expect_close(dc.host(), ref, 1e-4, max_abs(ref) + 1e-6,
                       "gemm_bf16_compute m" + std::to_string(s.m) + " k" + std::to_string(s.k) + " ta" +
                           std::to_string(ta) + " tb" + std::to_string(tb) + " pad" + std::to_string(s.pad) +
                           " beta" + std::to_string(beta));
          // The same with B rounded beforehand, as the step's weight copies are.
          const int b_used = b_cols - s.pad;
          gpu_test::Dev<std::uint16_t> b_rounded(static_cast<std::size_t>(b_rows) * b_used + 1, 0xdeadu);
          cu::convert_rows_to_bf16(b_rows, b_used, db.ptr(), b_cols, b_rounded.ptr());
          DevF dc2(c0);
          cu::gemm_bf16_compute_rounded_b(handle, op, s.m, s.n, s.k, da.ptr(), a_cols, b_rounded.ptr(), dc2.ptr(),
                                          s.n);
          expect_close(dc2.host(), ref, 1e-4, max_abs(ref) + 1e-6,
                       "gemm_bf16_compute_rounded_b m" + std::to_string(s.m) + " k" + std::to_string(s.k) + " ta" +
                           std::to_string(ta) + " tb" + std::to_string(tb) + " pad" + std::to_string(s.pad) +
                           " beta" + std::to_string(beta));
        }
      }
    }
  }
}

// ---------------------------------------------------------------- normalization / activations

TEST_F(GpuStep, LayerNormBackwardMatchesCpu) {
  for (int rows : {0, 1, 37, 300}) {
    for (int h : {33, 1000, 3000}) {
      const std::size_t n = static_cast<std::size_t>(rows) * h;
      const auto x = random_vector(n, 11, -2, 2), gy = random_vector(n, 12);
      const auto gamma = random_vector(h, 13, 0.5, 1.5), beta = random_vector(h, 14);
      std::vector<float> y(n), mean(rows), rstd(rows);
      layernorm_forward(rows, h, 1e-5f, x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data());
      std::vector<float> gx(n), gg(h), gb(h);
      layernorm_backward(rows, h, x.data(), gamma.data(), mean.data(), rstd.data(), gy.data(), gx.data(), gg.data(),
                         gb.data());
      DevF dx(x), dgamma(gamma), dmean(mean), drstd(rstd), dgy(gy);
      DevF dgx(n, kGarbage), dgg(h, kGarbage), dgb(h, kGarbage);
      cu::layernorm_backward(rows, h, dx.ptr(), dgamma.ptr(), dmean.ptr(), drstd.ptr(), dgy.ptr(), dgx.ptr(),
                             dgg.ptr(), dgb.ptr());
      const std::string what = " rows " + std::to_string(rows) + " h " + std::to_string(h);
      expect_close_to_max(dgx.host(), gx, 1e-4, "grad_x" + what);
      expect_close_to_max(dgg.host(), gg, 1e-4, "grad_gamma" + what);
      expect_close_to_max(dgb.host(), gb, 1e-4, "grad_beta" + what);
    }
  }
}

TEST_F(GpuStep, RmsNormForwardAndBackwardMatchCpu) {
  for (int rows : {0, 1, 37, 300}) {
    for (int h : {33, 1000, 3000}) {
      const std::size_t n = static_cast<std::size_t>(rows) * h;
      const auto x = random_vector(n, 31, -2, 2), gy = random_vector(n, 32);
      const auto gamma = random_vector(h, 33, 0.5, 1.5);
      std::vector<float> y(n), rstd(rows), gx(n), gg(h);
      rmsnorm_forward(rows, h, 1e-6f, x.data(), gamma.data(), y.data(), rstd.data());
      rmsnorm_backward(rows, h, x.data(), gamma.data(), rstd.data(), gy.data(), gx.data(), gg.data());
      DevF dx(x), dgamma(gamma), dgy(gy);
      DevF dy(n, kGarbage), drstd(static_cast<std::size_t>(rows), kGarbage), dgx(n, kGarbage), dgg(h, kGarbage);
      cu::rmsnorm_forward(rows, h, 1e-6f, dx.ptr(), dgamma.ptr(), dy.ptr(), drstd.ptr());
      cu::rmsnorm_backward(rows, h, dx.ptr(), dgamma.ptr(), drstd.ptr(), dgy.ptr(), dgx.ptr(), dgg.ptr());
      const std::string what = " rows " + std::to_string(rows) + " h " + std::to_string(h);
      expect_close_to_max(dy.host(), y, 1e-5, "y" + what);
      expect_close_to_max(drstd.host(), rstd, 1e-5, "rstd" + what);
      expect_close_to_max(dgx.host(), gx, 1e-4, "grad_x" + what);
      expect_close_to_max(dgg.host(), gg, 1e-4, "grad_gamma" + what);
    }
  }
}

TEST_F(GpuStep, RotaryForwardAndBackwardMatchCpu) {
  // Whole and partial rotation (rotary_dim < head_dim), rows spanning several sequences, and a row
  // stride past the rotated heads (the qkv projection's value columns), which must stay untouched.
  struct Case {
    int rows, seq, heads, head_dim, rotary_dim, extra;
  };
  for (const Case c : {Case{1, 1, 1, 2, 2, 0}, Case{96, 32, 12, 64, 64, 256}, Case{300, 100, 5, 128, 32, 7}}) {
    const int stride = c.heads * c.head_dim + c.extra;
    const std::size_t n = static_cast<std::size_t>(c.rows) * stride, table = std::size_t(c.seq) * c.rotary_dim / 2;
    std::vector<float> cos(table), sin(table);
    rotary_table(c.seq, c.rotary_dim, 1e6, cos.data(), sin.data());
    const auto x = random_vector(n, 41, -2, 2);
    auto y = x, g = x;
    rotary_forward(c.rows, c.seq, c.heads, c.head_dim, c.rotary_dim, stride, cos.data(), sin.data(), y.data());
    rotary_backward(c.rows, c.seq, c.heads, c.head_dim, c.rotary_dim, stride, cos.data(), sin.data(), g.data());
    DevF dcos(cos), dsin(sin), dy(x), dg(x);
    cu::rotary_forward(c.rows, c.seq, c.heads, c.head_dim, c.rotary_dim, stride, dcos.ptr(), dsin.ptr(), dy.ptr());
    cu::rotary_backward(c.rows, c.seq, c.heads, c.head_dim, c.rotary_dim, stride, dcos.ptr(), dsin.ptr(), dg.ptr());
    const std::string what = " rows " + std::to_string(c.rows) + " head_dim " + std::to_string(c.head_dim) +
                             " rotary " + std::to_string(c.rotary_dim);
    expect_close_to_max(dy.host(), y, 1e-6, "rotary_forward" + what);
    expect_close_to_max(dg.host(), g, 1e-6, "rotary_backward" + what);
  }
}

TEST_F(GpuStep, SwigluBackwardMatchesCpu) {
  for (int rows : {3, 37}) {
    for (int f : {33, 512}) {
      const auto x = random_vector(static_cast<std::size_t>(rows) * 2 * f, 21, -4, 4);
      const auto gy = random_vector(static_cast<std::size_t>(rows) * f, 22);
      std::vector<float> gx(x.size());
      swiglu_backward(rows, f, x.data(), gy.data(), gx.data());
      DevF dx(x), dgy(gy), dgx(x.size(), kGarbage);
      cu::swiglu_backward(rows, f, dx.ptr(), dgy.ptr(), dgx.ptr());
      // The CPU's polynomial exp (~2e-7) and fused multiply-adds on the device differ by rounding;
      // 1 + a (1 - s) cancels near a = -1.28, hence the absolute floor.
      expect_close(dgx.host(), gx, 1e-5, 0.05, "swiglu_backward rows " + std::to_string(rows));
    }
  }
}

// ---------------------------------------------------------------- attention

struct AttentionCase {
  int heads, seq, d, dv;  // dv: the value head size (MLA's differs from the query/key size d)
  bool causal;
};
// The 6200-row case is a long row (more than 48 KiB of scores); the last two take value heads
// apart from the query/key heads, as DeepSeek-V3's MLA (192 and 128). The GEMMs round their
// operands to TF32 (2^-11 relative): scores are off by about 1e-4 where the reference's are exact
// to 1e-7, so the tolerances are 3e-3 and 5e-3 of the largest entry; a wrong index, scale or
// mask gives errors of order 1.
const AttentionCase kAttentionCases[] = {{1, 1, 64, 64, false},  {3, 33, 40, 40, true},   {3, 33, 40, 40, false},
                                         {2, 300, 64, 64, true}, {5, 97, 256, 256, false}, {1, 6200, 16, 16, true},
                                         {3, 77, 192, 128, true}, {2, 65, 8, 6, true}};

std::string describe(const AttentionCase& c) {
  return "heads " + std::to_string(c.heads) + " seq " + std::to_string(c.seq) + " d " + std::to_string(c.d) + " dv " +
         std::to_string(c.dv) + (c.causal ? " causal" : "");
}

TEST_F(GpuStep, AttentionForwardSavingProbsMatchesCpu) {
  for (const AttentionCase& c : kAttentionCases) {
    const std::size_t n = static_cast<std::size_t>(c.heads) * c.seq * c.d;
    const std::size_t nv = static_cast<std::size_t>(c.heads) * c.seq * c.dv;
    const std::size_t np = static_cast<std::size_t>(c.heads) * c.seq * c.seq;
    const auto q = random_vector(n, 31), k = random_vector(n, 32), v = random_vector(nv, 33);
    std::vector<float> probs(np), out(nv);
    attention_forward(c.heads, c.seq, c.d, c.dv, c.causal, q.data(), k.data(), v.data(), probs.data(), out.data());
    DevF dq(q), dk(k), dv(v), dprobs(np, kGarbage), dout(nv, kGarbage);
    cu::BlasHandle blas;
    cu::attention_forward_saving_probs(blas, c.heads, c.seq, c.d, c.dv, c.causal, dq.ptr(), dk.ptr(), dv.ptr(),
                                       dprobs.ptr(), dout.ptr());
    const auto gpu_probs = dprobs.host();
    expect_close(gpu_probs, probs, 3e-3, 1e-3, "probs " + describe(c));
    if (c.causal) {
      for (int h = 0; h < c.heads; ++h)
        for (int i = 0; i < c.seq; ++i)
          for (int j = i + 1; j < c.seq; ++j)
            ASSERT_EQ(gpu_probs[(static_cast<std::size_t>(h) * c.seq + i) * c.seq + j], 0.0f) << "masked entry";
    }
    expect_close_to_max(dout.host(), out, 5e-3, "out " + describe(c));
  }
}

TEST_F(GpuStep, AttentionBackwardMatchesCpu) {
  for (const AttentionCase& c : kAttentionCases) {
    const std::size_t n = static_cast<std::size_t>(c.heads) * c.seq * c.d;
    const std::size_t nv = static_cast<std::size_t>(c.heads) * c.seq * c.dv;
    const std::size_t np = static_cast<std::size_t>(c.heads) * c.seq * c.seq;
    const auto q = random_vector(n, 41), k = random_vector(n, 42), v = random_vector(nv, 43);
    const auto go = random_vector(nv, 44);
    std::vector<float> probs(np), out(nv), gq(n), gk(n), gv(nv);
    attention_forward(c.heads, c.seq, c.d, c.dv, c.causal, q.data(), k.data(), v.data(), probs.data(), out.data());
    attention_backward(c.heads, c.seq, c.d, c.dv, q.data(), k.data(), v.data(), probs.data(), go.data(), gq.data(),
                       gk.data(), gv.data());
    DevF dq(q), dk(k), dv(v), dprobs(probs), dgo(go);
    DevF dgq(n, kGarbage), dgk(n, kGarbage), dgv(nv, kGarbage);
    cu::BlasHandle blas;
    cu::attention_backward(blas, c.heads, c.seq, c.d, c.dv, dq.ptr(), dk.ptr(), dv.ptr(), dprobs.ptr(), dgo.ptr(),
                           dgq.ptr(), dgk.ptr(), dgv.ptr());
    expect_close_to_max(dgq.host(), gq, 5e-3, "grad_q " + describe(c));
    expect_close_to_max(dgk.host(), gk, 5e-3, "grad_k " + describe(c));
    expect_close_to_max(dgv.host(), gv, 5e-3, "grad_v " + describe(c));
  }
}

// ---------------------------------------------------------------- head layouts

struct HeadCase {
  int b, s, heads, kv_heads, hd;
};
const HeadCase kHeadCases[] = {{1, 3, 4, 4, 8}, {2, 37, 6, 2, 33}, {2, 5, 8, 1, 16}, {3, 1, 3, 3, 1}};

std::string describe(const HeadCase& c) {
  return "b " + std::to_string(c.b) + " s " + std::to_string(c.s) + " heads " + std::to_string(c.heads) + "/" +
         std::to_string(c.kv_heads) + " hd " + std::to_string(c.hd);
}

std::size_t head_major(const HeadCase& c, int bi, int hi, int p) {
  return ((static_cast<std::size_t>(bi) * c.heads + hi) * c.s + p) * c.hd;
}

TEST_F(GpuStep, SplitAndMergeHeadsMatchTrainerLayout) {
  for (const HeadCase& c : kHeadCases) {
    const int q_w = c.heads * c.hd, kv_w = c.kv_heads * c.hd, qkv_w = q_w + 2 * kv_w, grp = c.heads / c.kv_heads;
    const std::size_t tokens = static_cast<std::size_t>(c.b) * c.s;
    const std::size_t hs = tokens * q_w;
    const auto qkv = random_vector(tokens * qkv_w, 51);
    std::vector<float> q(hs), k(hs), v(hs);
    for (int bi = 0; bi < c.b; ++bi)
      for (int p = 0; p < c.s; ++p)
        for (int hi = 0; hi < c.heads; ++hi)
          for (int x = 0; x < c.hd; ++x) {
            const float* row = qkv.data() + (static_cast<std::size_t>(bi) * c.s + p) * qkv_w;
            const std::size_t o = head_major(c, bi, hi, p) + x;
            const int j = hi / grp;
            q[o] = row[hi * c.hd + x];
            k[o] = row[q_w + j * c.hd + x];
            v[o] = row[q_w + kv_w + j * c.hd + x];
          }
    DevF dqkv(qkv), dq(hs, kGarbage), dk(hs, kGarbage), dv(hs, kGarbage);
    cu::split_heads(c.b, c.s, c.heads, c.kv_heads, c.hd, dqkv.ptr(), dq.ptr(), dk.ptr(), dv.ptr());
    EXPECT_EQ(dq.host(), q) << "split q " << describe(c);
    EXPECT_EQ(dk.host(), k) << "split k " << describe(c);
    EXPECT_EQ(dv.host(), v) << "split v " << describe(c);

    const auto gq = random_vector(hs, 52), gk = random_vector(hs, 53), gv = random_vector(hs, 54);
    std::vector<float> gqkv(tokens * qkv_w, 0.0f);
    for (int bi = 0; bi < c.b; ++bi)
      for (int p = 0; p < c.s; ++p)
        for (int hi = 0; hi < c.heads; ++hi)
          for (int x = 0; x < c.hd; ++x) {
            float* row = gqkv.data() + (static_cast<std::size_t>(bi) * c.s + p) * qkv_w;
            const std::size_t o = head_major(c, bi, hi, p) + x;
            const int j = hi / grp;
            row[hi * c.hd + x] = gq[o];
            row[q_w + j * c.hd + x] += gk[o];
            row[q_w + kv_w + j * c.hd + x] += gv[o];
          }
    DevF dgq(gq), dgk(gk), dgv(gv), dgqkv(gqkv.size(), kGarbage);
    cu::merge_heads_grad(c.b, c.s, c.heads, c.kv_heads, c.hd, dgq.ptr(), dgk.ptr(), dgv.ptr(), dgqkv.ptr());
    expect_close(dgqkv.host(), gqkv, 1e-6, 1e-6, "merge_heads_grad " + describe(c));
  }
}

TEST_F(GpuStep, HeadsTokensRoundTrip) {
  for (const HeadCase& c : kHeadCases) {
    const int width = c.heads * c.hd;
    const std::size_t n = static_cast<std::size_t>(c.b) * c.s * width;
    const auto heads = random_vector(n, 61);
    std::vector<float> tokens(n);
    for (int bi = 0; bi < c.b; ++bi)
      for (int hi = 0; hi < c.heads; ++hi)
        for (int p = 0; p < c.s; ++p)
          for (int x = 0; x < c.hd; ++x)
            tokens[(static_cast<std::size_t>(bi) * c.s + p) * width + hi * c.hd + x] = heads[head_major(c, bi, hi, p) + x];
    DevF dheads(heads), dtokens(n, kGarbage), dback(n, kGarbage);
    cu::heads_to_tokens(c.b, c.s, c.heads, c.hd, dheads.ptr(), dtokens.ptr());
    EXPECT_EQ(dtokens.host(), tokens) << "heads_to_tokens " << describe(c);
    cu::tokens_to_heads(c.b, c.s, c.heads, c.hd, dtokens.ptr(), dback.ptr());
    EXPECT_EQ(dback.host(), heads) << "tokens_to_heads " << describe(c);
  }
}

TEST_F(GpuStep, HeadLayoutsRejectUnevenGroups) {
  EXPECT_THROW(cu::split_heads(1, 1, 6, 4, 8, nullptr, nullptr, nullptr, nullptr), InputError);
  EXPECT_THROW(cu::merge_heads_grad(1, 1, 6, 0, 8, nullptr, nullptr, nullptr, nullptr), InputError);
}

// ---------------------------------------------------------------- MoE

struct MoeCase {
  int tokens, experts, k;
  double factor;  // < 1 so some choices are dropped
};
const MoeCase kMoeCases[] = {{37, 8, 1, 0.5}, {513, 8, 2, 0.6}, {300, 40, 2, 0.7}};

std::string describe(const MoeCase& c) {
  return "T " + std::to_string(c.tokens) + " E " + std::to_string(c.experts) + " k " + std::to_string(c.k);
}

bool has_dropped_choice(const GatingOutput& g) {
  return std::any_of(g.position.begin(), g.position.end(), [](std::int32_t p) { return p < 0; });
}

TEST_F(GpuStep, DispatchAndCombineBackwardMatchCpu) {
  for (const MoeCase& c : kMoeCases) {
    for (int hidden : {33, 256}) {
      const auto logits = random_vector(static_cast<std::size_t>(c.tokens) * c.experts, 71, -2, 2);
      GatingOutput g;
      gating_forward(logits.data(), c.tokens, c.experts, GatingConfig{c.k, c.factor, 4, true}, g);
      ASSERT_TRUE(has_dropped_choice(g)) << describe(c);
      const std::size_t nbuf = static_cast<std::size_t>(c.experts) * g.capacity * hidden;
      const std::size_t nx = static_cast<std::size_t>(c.tokens) * hidden;
      const auto grad_buf = random_vector(nbuf, 72), buf = random_vector(nbuf, 73), grad_out = random_vector(nx, 74);
      std::vector<float> gx(nx), gbuf(nbuf), gw(g.weight.size());
      dispatch_backward(g, grad_buf.data(), hidden, gx.data());
      combine_backward(g, buf.data(), grad_out.data(), hidden, gbuf.data(), gw.data());

      DevI dexpert(g.expert), dposition(g.position);
      DevF dweight(g.weight), dgrad_buf(grad_buf), dbuf(buf), dgrad_out(grad_out);
      DevF dgx(nx, kGarbage), dgbuf(nbuf, kGarbage), dgw(gw.size(), kGarbage);
      cu::dispatch_backward(c.tokens, c.k, c.experts, g.capacity, hidden, dexpert.ptr(), dposition.ptr(),
                            dgrad_buf.ptr(), dgx.ptr());
      cu::combine_backward(c.tokens, c.k, c.experts, g.capacity, hidden, dexpert.ptr(), dposition.ptr(),
                           dweight.ptr(), dbuf.ptr(), dgrad_out.ptr(), dgbuf.ptr(), dgw.ptr());
      const std::string what = describe(c) + " hidden " + std::to_string(hidden);
      expect_close(dgx.host(), gx, 1e-6, 1e-6, "dispatch_backward " + what);
      expect_close(dgbuf.host(), gbuf, 1e-6, 1e-6, "combine_backward grad_buf " + what);
      expect_close(dgw.host(), gw, 1e-5, std::sqrt(static_cast<double>(hidden)), "combine_backward grad_weight " + what);
    }
  }
}

// Routing from the device gating, downloaded so the CPU backward sees exactly the same choices.
void check_gating_backward(const std::vector<float>& logits, int tokens, int experts, const GatingConfig& cfg,
                           float grad_aux, const std::string& what) {
  DevF dlogits(logits);
  cu::DeviceGating dg;
  cu::gating_forward(dlogits.ptr(), tokens, experts, cfg, dg);
  GatingOutput g;
  dg.download(g);
  ASSERT_TRUE(has_dropped_choice(g)) << what;
  const auto gw = random_vector(static_cast<std::size_t>(tokens) * cfg.k, 81);
  std::vector<float> ref(static_cast<std::size_t>(tokens) * experts);
  gating_backward(g, gw.data(), grad_aux, ref.data());
  DevF dgw(gw), dgl(ref.size(), kGarbage);
  cu::gating_backward(dg, dgw.ptr(), grad_aux, dgl.ptr());
  expect_close_to_max(dgl.host(), ref, 1e-4, "gating_backward " + what);
}

TEST_F(GpuStep, GatingBackwardMatchesCpu) {
  for (const MoeCase& c : kMoeCases) {
    const auto logits = random_vector(static_cast<std::size_t>(c.tokens) * c.experts, 82, -2, 2);
    check_gating_backward(logits, c.tokens, c.experts, GatingConfig{c.k, c.factor, 4, true}, 0.37f, describe(c));
  }
}

TEST_F(GpuStep, GatingBackwardClampedDenominator) {
  // Every token prefers expert 0 by far, which overflows and drops most first choices; the kept
  // second choices then have probabilities ~e^-20 < FLT_EPSILON, so the clamp path runs.
  const int tokens = 64, experts = 8;
  auto logits = random_vector(static_cast<std::size_t>(tokens) * experts, 83);
  for (int t = 0; t < tokens; ++t) {
    logits[static_cast<std::size_t>(t) * experts] = 30.0f;
    logits[static_cast<std::size_t>(t) * experts + 1 + t % (experts - 1)] = 10.0f;
  }
  check_gating_backward(logits, tokens, experts, GatingConfig{2, 1.0, 4, true}, 0.5f, "clamped");
}

// ---------------------------------------------------------------- embedding and loss

TEST_F(GpuStep, EmbeddingForwardAndBackwardMatchTrainer) {
  const int v0 = 100, v_local = 50;
  for (int tokens : {5, 300}) {
    for (int hidden : {33, 64}) {
      const auto ids = random_ids(tokens, 91, 80, 170);  // some owned by other ranks, repeats
      const auto table = random_vector(static_cast<std::size_t>(v_local) * hidden, 92);
      const auto grad_out = random_vector(static_cast<std::size_t>(tokens) * hidden, 93);
      const auto table_grad0 = random_vector(table.size(), 94);
      std::vector<float> out(static_cast<std::size_t>(tokens) * hidden, 0.0f), table_grad = table_grad0;
      for (int t = 0; t < tokens; ++t) {
        const int id = ids[t] - v0;
        if (id < 0 || id >= v_local) continue;
        for (int x = 0; x < hidden; ++x) {
          out[static_cast<std::size_t>(t) * hidden + x] = table[static_cast<std::size_t>(id) * hidden + x];
          table_grad[static_cast<std::size_t>(id) * hidden + x] += grad_out[static_cast<std::size_t>(t) * hidden + x];
        }
      }
      DevI dids(ids);
      DevF dtable(table), dout(out.size(), kGarbage), dgo(grad_out), dtg(table_grad0);
      cu::embedding_forward(tokens, hidden, v0, v_local, dids.ptr(), dtable.ptr(), dout.ptr());
      EXPECT_EQ(dout.host(), out) << "embedding_forward T " << tokens;
      cu::embedding_backward(tokens, hidden, v0, v_local, dids.ptr(), dgo.ptr(), dtg.ptr());
      expect_close(dtg.host(), table_grad, 1e-5, 1.0, "embedding_backward T " + std::to_string(tokens));
    }
  }
}

TEST_F(GpuStep, CrossEntropyStepsMatchTrainer) {
  const int v0 = 1000;
  for (int tokens : {3, 77}) {
    for (int v_local : {50, 1500}) {
      const std::size_t n = static_cast<std::size_t>(tokens) * v_local;
      const auto logits = random_vector(n, 101, -5, 5);
      const auto targets = random_ids(tokens, 102, v0 - 20, v0 + v_local + 20);
      const float scale = 1.0f / (static_cast<float>(tokens) * 2.0f);
      // The trainer's passes on one rank (no all-reduce in between): the CPU kernels it runs.
      std::vector<float> lg = logits, mx(tokens), tg(tokens), se(tokens);
      ce_max_and_target(tokens, v_local, v0, lg.data(), targets.data(), mx.data(), tg.data());
      std::vector<float> exp_lg = lg;
      ce_exp_and_sum(tokens, v_local, mx.data(), exp_lg.data(), se.data());
      std::vector<float> grad = exp_lg;
      ce_gradient(tokens, v_local, v0, targets.data(), se.data(), scale, grad.data());

      DevF dlg(logits), dmx(tokens, kGarbage), dtg(tokens, kGarbage), dse(tokens, kGarbage);
      DevI dtargets(targets);
      const std::string what = " T " + std::to_string(tokens) + " V " + std::to_string(v_local);
      cu::ce_max_and_target(tokens, v_local, v0, dlg.ptr(), dtargets.ptr(), dmx.ptr(), dtg.ptr());
      EXPECT_EQ(dmx.host(), mx) << "row_max" << what;
      EXPECT_EQ(dtg.host(), tg) << "target_logit" << what;
      cu::ce_exp_and_sum(tokens, v_local, dmx.ptr(), dlg.ptr(), dse.ptr());
      expect_close(dlg.host(), exp_lg, 1e-5, 1e-6, "exp logits" + what);
      expect_close(dse.host(), se, 1e-5, 0.0, "row_sum" + what);
      cu::ce_gradient(tokens, v_local, v0, dtargets.ptr(), dse.ptr(), scale, dlg.ptr());
      expect_close(dlg.host(), grad, 1e-4, 1e-3 * scale, "gradient" + what);
    }
  }
}

}  // namespace
}  // namespace tedsim::kernels
