// Every CUDA kernel against its CPU reference on random inputs of several sizes. Inputs are
// rounded to the storage dtype first and the CPU reference runs on the rounded values, so the
// tolerance only covers fp32-vs-fp32 arithmetic order plus the rounding of the outputs:
// bf16 ~1e-2 relative, fp16 ~1e-3, fp32 ~1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tedsim/kernels/cpu/activations.hpp"
#include "tedsim/kernels/cpu/adam.hpp"
#include "tedsim/kernels/cpu/attention.hpp"
#include "tedsim/kernels/cpu/dispatch.hpp"
#include "tedsim/kernels/cpu/gating.hpp"
#include "tedsim/kernels/cpu/gemm.hpp"
#include "tedsim/kernels/cpu/layernorm.hpp"
#include "tedsim/kernels/cuda/cuda_kernels.hpp"
#include "tedsim/kernels/device.hpp"
#include "gpu_test_support.hpp"

namespace tedsim::kernels {
namespace {

namespace cu = tedsim::kernels::cuda;

using gpu_test::Gpu;

using gpu_test::random_vector;

double rel_tol(Dtype t) { return t == Dtype::bf16 ? 1e-2 : (t == Dtype::fp16 ? 1e-3 : 1e-5); }

// A device tensor in a storage dtype, filled from host fp32 (rounded to the dtype).
struct DevTensor {
  Dtype type;
  std::size_t n;
  cu::DeviceBuffer buf;
  DevTensor(Dtype t, const std::vector<float>& host) : type(t), n(host.size()), buf(host.size() * bytes_of(t) + 4) {
    cu::DeviceBuffer tmp(n * sizeof(float) + 4);
    tmp.upload(host.data(), n * sizeof(float));
    cu::convert_from_fp32(tmp.as<float>(), type, buf.data(), n);
    cu::synchronize();
  }
  DevTensor(Dtype t, std::size_t count) : type(t), n(count), buf(count * bytes_of(t) + 4) { buf.zero(); }
  std::vector<float> to_host() const {
    cu::DeviceBuffer tmp(n * sizeof(float) + 4);
    cu::convert_to_fp32(buf.data(), type, tmp.as<float>(), n);
    std::vector<float> host(n);
    tmp.download(host.data(), n * sizeof(float));
    return host;
  }
};

struct DevF32 {
  cu::DeviceBuffer buf;
  std::size_t n;
  explicit DevF32(const std::vector<float>& host) : buf(host.size() * sizeof(float) + 4), n(host.size()) {
    buf.upload(host.data(), n * sizeof(float));
  }
  float* ptr() { return buf.as<float>(); }
  std::vector<float> to_host() const {
    cu::synchronize();
    std::vector<float> h(n);
    buf.download(h.data(), n * sizeof(float));
    return h;
  }
};

// |gpu - ref| <= rtol * (|ref| + scale): scale keeps near-zero entries of a sum from failing on
// absolute rounding noise of the terms.
void expect_close(const std::vector<float>& gpu, const std::vector<float>& ref, double rtol, double scale,
                  const std::string& what) {
  ASSERT_EQ(gpu.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ASSERT_LE(std::abs(gpu[i] - ref[i]), rtol * (std::abs(ref[i]) + scale)) << what << " index " << i << ": " << gpu[i]
                                                                             << " vs " << ref[i];
  }
}

const Dtype kTypes[] = {Dtype::fp32, Dtype::fp16, Dtype::bf16};

TEST_F(Gpu, GemmVariantsMatchReference) {
  cu::BlasHandle handle;
  struct Shape {
    int m, n, k;
  };
  for (Dtype t : kTypes) {
    for (Shape s : {Shape{64, 256, 64}, Shape{128, 96, 200}, Shape{7, 33, 5}}) {
      for (int ta = 0; ta < 2; ++ta) {
        for (int tb = 0; tb < 2; ++tb) {
          GemmOp op{ta == 1, tb == 1, 1.0f, 0.0f};
          const int lda = ta ? s.m : s.k, ldb = tb ? s.k : s.n;
          DevTensor a(t, random_vector(static_cast<std::size_t>(s.m) * s.k, 1));
          DevTensor b(t, random_vector(static_cast<std::size_t>(s.k) * s.n, 2));
          const auto ah = a.to_host(), bh = b.to_host();
          std::vector<float> ref(static_cast<std::size_t>(s.m) * s.n);
          gemm_reference(op, s.m, s.n, s.k, ah.data(), lda, bh.data(), ldb, ref.data(), s.n);
          const double scale = std::sqrt(static_cast<double>(s.k)) * 0.3;  // typical |C| for U(-1,1)
          for (int variant = 0; variant < 2; ++variant) {
            DevTensor c(t, ref.size());
            if (variant == 0) {
              cu::gemm(handle, t, op, s.m, s.n, s.k, a.buf.data(), lda, b.buf.data(), ldb, c.buf.data(), s.n);
            } else {
              cu::gemm_lt(handle, t, op, s.m, s.n, s.k, a.buf.data(), lda, b.buf.data(), ldb, c.buf.data(), s.n);
            }
            cu::synchronize();
            expect_close(c.to_host(), ref, rel_tol(t), scale,
                         std::string(variant ? "gemm_lt " : "gemm ") + to_string(t));
          }
        }
      }
    }
  }
}

TEST_F(Gpu, BatchedAndGroupedGemm) {
  cu::BlasHandle handle;
  const int groups = 4, rows = 32, n = 48, k = 40;
  const int m[groups] = {32, 0, 9, 17};
  for (Dtype t : kTypes) {
    DevTensor a(t, random_vector(static_cast<std::size_t>(groups) * rows * k, 3));
    DevTensor b(t, random_vector(static_cast<std::size_t>(groups) * k * n, 4));
    const auto ah = a.to_host(), bh = b.to_host();
    std::vector<float> ref(static_cast<std::size_t>(groups) * rows * n, 0.0f);
    gemm_grouped_strided(GemmOp{}, groups, m, rows, n, k, ah.data(), bh.data(), ref.data());
    DevTensor c(t, ref.size());
    std::vector<cu::DeviceGemmProblem> problems;
    const std::size_t es = bytes_of(t);
    for (int g = 0; g < groups; ++g) {
      cu::DeviceGemmProblem p;
      p.m = m[g];
      p.n = n;
      p.k = k;
      p.a = static_cast<const char*>(a.buf.data()) + es * g * rows * k;
      p.lda = k;
      p.b = static_cast<const char*>(b.buf.data()) + es * g * k * n;
      p.ldb = n;
      p.c = static_cast<char*>(c.buf.data()) + es * g * rows * n;
      p.ldc = n;
      problems.push_back(p);
    }
    cu::gemm_grouped(handle, t, GemmOp{}, problems);
    expect_close(c.to_host(), ref, rel_tol(t), 2.0, std::string("grouped ") + to_string(t));

    // Strided batch at full capacity vs per-group references with m = rows.
    const int full[groups] = {rows, rows, rows, rows};
    gemm_grouped_strided(GemmOp{}, groups, full, rows, n, k, ah.data(), bh.data(), ref.data());
    DevTensor cb(t, ref.size());
    cu::gemm_strided_batched(handle, t, GemmOp{}, rows, n, k, a.buf.data(), k, static_cast<long long>(rows) * k,
                             b.buf.data(), n, static_cast<long long>(k) * n, cb.buf.data(), n,
                             static_cast<long long>(rows) * n, groups);
    expect_close(cb.to_host(), ref, rel_tol(t), 2.0, std::string("strided batched ") + to_string(t));
  }
}

TEST_F(Gpu, GatingMatchesCpu) {
  struct Case {
    int tokens, experts, k;
    double f;
  };
  for (Case c : {Case{64, 8, 1, 1.0}, Case{1000, 16, 2, 1.0}, Case{4096, 64, 2, 0.8}, Case{3000, 32, 4, 1.25},
                 Case{777, 8, 8, 1.0}}) {
    for (int ties = 0; ties < 2; ++ties) {
      auto logits = random_vector(static_cast<std::size_t>(c.tokens) * c.experts, 7 + ties, -3, 3);
      if (ties) {
        for (float& x : logits) x = std::round(x);
      }
      const GatingConfig cfg{c.k, c.f, 4, true};
      GatingOutput cpu, gpu;
      gating_forward(logits.data(), c.tokens, c.experts, cfg, cpu);
      DevF32 dl(logits);
      cu::DeviceGating dg;
      cu::gating_forward(dl.ptr(), c.tokens, c.experts, cfg, dg);
      dg.download(gpu);
      ASSERT_EQ(gpu.capacity, cpu.capacity);
      EXPECT_EQ(gpu.expert, cpu.expert);
      EXPECT_EQ(gpu.position, cpu.position);
      EXPECT_EQ(gpu.kept, cpu.kept);
      EXPECT_EQ(gpu.routed, cpu.routed);
      EXPECT_EQ(gpu.top1_count, cpu.top1_count);
      expect_close(gpu.probs, cpu.probs, 1e-5, 1e-3, "probs");
      expect_close(gpu.weight, cpu.weight, 1e-5, 1e-3, "weight");
      EXPECT_NEAR(gpu.aux_loss, cpu.aux_loss, 1e-4 * cpu.aux_loss);
    }
  }
}

TEST_F(Gpu, DispatchCombineMatchCpu) {
  for (Dtype t : kTypes) {
    for (int hidden : {64, 1000}) {
      const int T = 513, E = 8, k = 2;
      const auto logits = random_vector(static_cast<std::size_t>(T) * E, 11);
      GatingOutput g;
      gating_forward(logits.data(), T, E, GatingConfig{k, 0.9, 4, true}, g);
      DevTensor x(t, random_vector(static_cast<std::size_t>(T) * hidden, 12));
      const auto xh = x.to_host();
      const std::size_t nbuf = static_cast<std::size_t>(E) * g.capacity * hidden;
      std::vector<float> buf_ref(nbuf), out_ref(static_cast<std::size_t>(T) * hidden);
      dispatch(g, xh.data(), hidden, buf_ref.data());
      combine(g, buf_ref.data(), hidden, out_ref.data());

      cu::DeviceBuffer ex(g.expert.size() * 4), pos(g.position.size() * 4), w(g.weight.size() * 4);
      ex.upload(g.expert.data(), ex.bytes());
      pos.upload(g.position.data(), pos.bytes());
      w.upload(g.weight.data(), w.bytes());
      DevTensor buf(t, nbuf), out(t, out_ref.size());
      cu::dispatch(t, T, k, E, g.capacity, hidden, ex.as<int>(), pos.as<int>(), x.buf.data(), buf.buf.data());
      cu::combine(t, T, k, E, g.capacity, hidden, ex.as<int>(), pos.as<int>(), w.as<float>(), buf.buf.data(),
                  out.buf.data());
      cu::synchronize();
      EXPECT_EQ(buf.to_host(), buf_ref) << "dispatch is an exact copy";
      expect_close(out.to_host(), out_ref, rel_tol(t), 0.1, std::string("combine ") + to_string(t));
    }
  }
}

TEST_F(Gpu, LayerNormGeluSwigluMatchCpu) {
  for (Dtype t : kTypes) {
    for (int rows : {1, 37}) {
      for (int h : {64, 2048, 3000}) {
        DevTensor x(t, random_vector(static_cast<std::size_t>(rows) * h, 21, -2, 2));
        const auto xh = x.to_host();
        const auto gamma = random_vector(h, 22, 0.5, 1.5), beta = random_vector(h, 23);
        std::vector<float> y_ref(xh.size()), mean_ref(rows), rstd_ref(rows);
        layernorm_forward(rows, h, 1e-5f, xh.data(), gamma.data(), beta.data(), y_ref.data(), mean_ref.data(),
                          rstd_ref.data());
        const std::vector<float> zeros_rows(rows, 0.0f);
        DevF32 dg(gamma), db(beta), dm(zeros_rows), dr(zeros_rows);
        DevTensor y(t, xh.size());
        cu::layernorm_forward(t, rows, h, 1e-5f, x.buf.data(), dg.ptr(), db.ptr(), y.buf.data(), dm.ptr(), dr.ptr());
        cu::synchronize();
        expect_close(y.to_host(), y_ref, rel_tol(t), 1.0, std::string("layernorm ") + to_string(t));
        expect_close(dr.to_host(), rstd_ref, 1e-4, 0.0, "rstd");

        std::vector<float> g_ref(xh.size()), gb_ref(xh.size());
        gelu_forward(xh.size(), xh.data(), g_ref.data());
        DevTensor gy(t, xh.size()), gx(t, xh.size());
        cu::gelu_forward(t, xh.size(), x.buf.data(), gy.buf.data());
        const auto ones = std::vector<float>(xh.size(), 1.0f);
        DevTensor dy(t, ones);
        gelu_backward(xh.size(), xh.data(), ones.data(), gb_ref.data());
        cu::gelu_backward(t, xh.size(), x.buf.data(), dy.buf.data(), gx.buf.data());
        cu::synchronize();
        expect_close(gy.to_host(), g_ref, rel_tol(t), 0.05, std::string("gelu ") + to_string(t));
        expect_close(gx.to_host(), gb_ref, rel_tol(t), 0.05, std::string("gelu backward ") + to_string(t));

        const int f = h / 2;
        std::vector<float> s_ref(static_cast<std::size_t>(rows) * f);
        swiglu_forward(rows, f, xh.data(), s_ref.data());
        DevTensor sy(t, s_ref.size());
        cu::swiglu_forward(t, rows, f, x.buf.data(), sy.buf.data());
        cu::synchronize();
        expect_close(sy.to_host(), s_ref, rel_tol(t), 0.05, std::string("swiglu ") + to_string(t));
      }
    }
  }
}

TEST_F(Gpu, AdamMatchesCpu) {
  for (std::size_t n : {1u, 1000u, 1u << 20}) {
    AdamConfig cfg;
    cfg.weight_decay = 0.01f;
    auto p = random_vector(n, 31), g = random_vector(n, 32), m = random_vector(n, 33, -0.1f, 0.1f),
         v = random_vector(n, 34, 0.0f, 0.01f);
    DevF32 dp(p), dgr(g), dm(m), dv(v);
    for (int step = 1; step <= 3; ++step) {
      adam_step(n, cfg, step, p.data(), g.data(), m.data(), v.data());
      cu::adam_step(n, cfg, step, dp.ptr(), dgr.ptr(), dm.ptr(), dv.ptr());
    }
    expect_close(dp.to_host(), p, 1e-5, 1e-2, "adam params");
    expect_close(dm.to_host(), m, 1e-5, 1e-3, "adam m");
    expect_close(dv.to_host(), v, 1e-5, 1e-4, "adam v");
  }
}

// cu::attention_forward against the CPU reference on random q, k, v of [heads, seq, d].
void expect_attention_matches_cpu(int heads, int seq, int d, bool causal, const char* what) {
  const std::size_t n = static_cast<std::size_t>(heads) * seq * d;
  const auto q = random_vector(n, 41), k = random_vector(n, 42), v = random_vector(n, 43);
  std::vector<float> probs(static_cast<std::size_t>(heads) * seq * seq), out_ref(n);
  attention_forward(heads, seq, d, causal, q.data(), k.data(), v.data(), probs.data(), out_ref.data());
  const std::vector<float> zeros(n, 0.0f);
  DevF32 dq(q), dk(k), dv(v), dout(zeros);
  cu::attention_forward(heads, seq, d, causal, dq.ptr(), dk.ptr(), dv.ptr(), dout.ptr());
  expect_close(dout.to_host(), out_ref, 1e-4, 0.1, what);
}

TEST_F(Gpu, AttentionForwardMatchesCpu) {
  for (bool causal : {false, true}) {
    for (int seq : {1, 64, 300}) expect_attention_matches_cpu(3, seq, 64, causal, "attention");
  }
}

// A score row of 12270 floats (49080 bytes) plus the kernel's static scratch passes the 48 KiB
// default only with the shared-memory opt-in, which must count the static bytes too.
TEST_F(Gpu, AttentionForwardLongRowNeedsTheSharedMemoryOptIn) {
  expect_attention_matches_cpu(1, 12270, 16, true, "attention, long row");
}

TEST(GpuDiscovery, NeverCrashes) {
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_TRUE(built_with_cuda());
  if (n == 0) {
    EXPECT_NE(describe_cuda_unavailable().find("no CUDA device"), std::string::npos);
  }
}

}  // namespace
}  // namespace tedsim::kernels
