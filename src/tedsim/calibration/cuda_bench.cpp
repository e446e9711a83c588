// CUDA bench: cuBLAS GEMMs in the model's dtype (bf16/fp16, fp32 accumulation) and the CUDA
// kernels of src/tedsim/kernels/cuda, timed with CUDA events. Each is checked against the CPU
// kernels on the same (dtype-rounded) inputs before timing: sampled entries for GEMMs, whole
// outputs for the rest. Softmax has no standalone CUDA kernel (it is fused into attention), so it
// is not measured here and the profile answers it from its fallback (reported as a warning).
#include "tedsim/calibration/bench.hpp"
#include "tedsim/core/error.hpp"

#ifdef TEDSIM_KERNELS_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <random>

#include "tedsim/calibration/cross_entropy_case.hpp"
#include "tedsim/calibration/device_timer.hpp"
#include "tedsim/kernels/cpu/activations.hpp"
#include "tedsim/kernels/cpu/dispatch.hpp"
#include "tedsim/kernels/cpu/fp8.hpp"
#include "tedsim/kernels/cpu/router_of_model.hpp"
#include "tedsim/kernels/cpu/layernorm.hpp"
#include "tedsim/kernels/cuda/cuda_kernels.hpp"
#include "tedsim/kernels/cuda/step_kernels.hpp"
#include "tedsim/kernels/device.hpp"

namespace tedsim::calibration {
namespace {

namespace tk = tedsim::kernels;
namespace cu = tedsim::kernels::cuda;
using Buf = std::shared_ptr<cu::DeviceBuffer>;

// Uploads fp32 host values as `type` and returns the dtype-rounded values (what the GPU sees).
Buf upload(const std::vector<float>& host, Dtype type, std::vector<float>* rounded = nullptr) {
  cu::DeviceBuffer staging(host.size() * 4);
  staging.upload(host.data(), staging.bytes());
  auto b = std::make_shared<cu::DeviceBuffer>(host.size() * bytes_of(type));
  cu::convert_from_fp32(staging.as<float>(), type, b->data(), host.size());
  if (rounded) {
    cu::convert_to_fp32(b->data(), type, staging.as<float>(), host.size());
    rounded->resize(host.size());
    staging.download(rounded->data(), staging.bytes());
  }
  return b;
}

std::vector<float> download(const cu::DeviceBuffer& b, Dtype type, std::size_t n) {
  cu::DeviceBuffer staging(n * 4);
  cu::convert_to_fp32(b.data(), type, staging.as<float>(), n);
  std::vector<float> out(n);
  staging.download(out.data(), n * 4);
  return out;
}

std::int64_t count_diff(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    wrong += !(std::isfinite(got[i]) && std::abs(got[i] - want[i]) <= tol * (1.0 + std::abs(want[i])));
  return wrong;
}

class CudaBench final : public Bench {
 public:
  explicit CudaBench(Dtype dtype) : dtype_(dtype), blas_(std::make_shared<cu::BlasHandle>()) {}
  std::string device_name() const override { return "CUDA device"; }
  Dtype dtype() const override { return dtype_; }

  Prepared gemm(const GemmShape& s) override {
    if (s.dtype == Dtype::fp8) return gemm_fp8(s);
    const int m = int(s.m), n = int(s.n), k = int(s.k), batch = int(s.batch);
    const Dtype t = dtype_;
    std::vector<float> ha, hb;
    Buf a = upload(random_vector(std::size_t(batch) * m * k, 1), t, &ha);
    Buf b = upload(random_vector(std::size_t(batch) * k * n, 2), t, &hb);
    Buf c = std::make_shared<cu::DeviceBuffer>(std::size_t(batch) * m * n * bytes_of(t));
    auto blas = blas_;
    Prepared p;
    p.what = "gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    p.run = [=] {
      if (batch == 1)
        cu::gemm(*blas, t, tk::GemmOp{}, m, n, k, a->data(), k, b->data(), n, c->data(), n);
      else
        cu::gemm_strided_batched(*blas, t, tk::GemmOp{}, m, n, k, a->data(), k, (long long)m * k, b->data(), n,
                                 (long long)k * n, c->data(), n, (long long)m * n, batch);
    };
    auto pa = std::make_shared<std::vector<float>>(std::move(ha)), pb = std::make_shared<std::vector<float>>(std::move(hb));
    p.check = [=] {
      p.run();
      cu::synchronize();
      const std::vector<float> hc = download(*c, t, std::size_t(batch) * m * n);
      std::mt19937 rng(3);
      std::int64_t wrong = 0;
      for (int i2 = 0; i2 < 64; ++i2) {
        const std::size_t bi = rng() % unsigned(batch), i = rng() % unsigned(m), j = rng() % unsigned(n);
        double want = 0, mag = 0;
        for (int q = 0; q < k; ++q) {
          const double x = double((*pa)[bi * m * k + i * k + q]) * (*pb)[bi * k * n + q * std::size_t(n) + j];
          want += x;
          mag += std::abs(x);
        }
        const double got = hc[bi * m * n + i * n + j];
        wrong += !(std::isfinite(got) && std::abs(got - want) <= 1e-2 * (mag + 1));
      }
      return wrong;
    };
    return p;
  }

  // Transformer Engine's FP8 linear: E4M3 input and weight (per-tensor scales), bf16 output,
  // cuBLASLt; a grouped GEMM's experts one call each, as Transformer Engine's grouped linear
  // issues them. The quantization kernels are separate points (elementwise, bf16), as the
  // workload prices them. Checked on sampled entries against the product of the same E4M3 values.
  Prepared gemm_fp8(const GemmShape& s) {
    std::string why;
    if (!cu::fp8_gemm_supported(&why)) throw InputError("FP8 GEMMs: " + why);
    const int m = int(s.m), n = int(s.n), k = int(s.k), batch = int(s.batch);
    const std::size_t a_n = std::size_t(batch) * m * k, w_n = std::size_t(batch) * n * k;
    constexpr float kAQuant = 200.0f, kWQuant = 300.0f;  // inputs in [-1, 1] scaled well inside E4M3's range
    auto quantized = [](std::size_t count, unsigned seed, float scale) {
      const std::vector<float> x = random_vector(count, seed);
      cu::DeviceBuffer staging(count * 4);
      staging.upload(x.data(), staging.bytes());
      auto bytes = std::make_shared<cu::DeviceBuffer>(count + 16);
      cu::quantize_e4m3(staging.as<float>(), count, scale, bytes->data());
      cu::synchronize();
      return std::make_pair(bytes, std::make_shared<std::vector<float>>(tk::quantize_e4m3(x, scale)));
    };
    const auto [a, ha] = quantized(a_n, 1, kAQuant);
    const auto [w, hw] = quantized(w_n, 2, kWQuant);
    const float inverse[2] = {1.0f / kAQuant, 1.0f / kWQuant};
    auto scales = std::make_shared<cu::DeviceBuffer>(sizeof inverse);
    scales->upload(inverse, sizeof inverse);
    Buf c = std::make_shared<cu::DeviceBuffer>(std::size_t(batch) * m * n * 2);
    auto blas = blas_;
    Prepared p;
    p.what = "gemm " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + " fp8";
    p.run = [=] {
      for (int e = 0; e < batch; ++e) {
        const auto* ae = static_cast<const unsigned char*>(a->data()) + std::size_t(e) * m * k;
        const auto* we = static_cast<const unsigned char*>(w->data()) + std::size_t(e) * n * k;
        auto* ce = static_cast<unsigned char*>(c->data()) + std::size_t(e) * m * n * 2;
        cu::gemm_fp8(*blas, m, n, k, ae, we, scales->as<float>(), scales->as<float>() + 1, ce);
      }
    };
    p.check = [=] {
      p.run();
      cu::synchronize();
      const std::vector<float> hc = download(*c, Dtype::bf16, std::size_t(batch) * m * n);
      std::mt19937 rng(3);
      std::int64_t wrong = 0;
      for (int sample = 0; sample < 64; ++sample) {
        const std::size_t e = rng() % unsigned(batch), i = rng() % unsigned(m), j = rng() % unsigned(n);
        double want = 0, mag = 0;
        for (int q = 0; q < k; ++q) {
          const double x = double((*ha)[(e * m + i) * k + q]) * (*hw)[(e * n + j) * k + q] / (double(kAQuant) * kWQuant);
          want += x;
          mag += std::abs(x);
        }
        const double got = hc[(e * m + i) * n + j];
        wrong += !(std::isfinite(got) && std::abs(got - want) <= 1e-2 * (std::abs(want) + 1e-2 * mag) + 1e-6);
      }
      return wrong;
    };
    return p;
  }

  // Today's routers (kernels/cuda/router.cu), the one the model's step runs, at the gating bytes
  // the workload asks for (as the CPU bench sizes them); checked against the CPU router: the same
  // experts and positions, weights within 1e-4.
  Prepared router(double bytes, const ModelSpec& model) {
    const int E = model.moe.experts, k = model.moe.top_k;
    const double passes = 1.0 + (model.moe.group_limited() ? 1.0 : 0.0);
    const int T = int(std::max<std::int64_t>(1, std::int64_t(bytes / (E * 4.0 * passes + k * 12.0))));
    const auto logits = random_vector(std::size_t(T) * E, 4, -3, 3);
    Buf dl = upload(logits, Dtype::fp32);
    auto out = std::make_shared<cu::DeviceRouter>();
    const tk::RouterConfig cfg = tk::router_config(model.moe);
    Prepared p;
    p.what = std::string("kernel gating (") + to_string(model.moe.router) + (model.moe.dropless() ? ", dropless)" : ")");
    p.bytes = double(T) * (E * 4.0 * passes + k * 12.0);
    p.run = [=] { cu::route_forward(dl->as<float>(), T, E, cfg, *out); };
    p.check = [=] {
      p.run();
      cu::synchronize();
      tk::RouterOutput got, ref;
      out->download(got);
      tk::route_forward(logits.data(), nullptr, T, E, cfg, ref);
      std::int64_t wrong = 0;
      for (std::size_t i = 0; i < ref.gate.expert.size(); ++i)
        wrong += got.gate.expert[i] != ref.gate.expert[i] || got.gate.position[i] != ref.gate.position[i] ||
                 std::abs(got.gate.weight[i] - ref.gate.weight[i]) > 1e-4f;
      return wrong;
    };
    return p;
  }

  Prepared kernel(KernelKind kind, double bytes, const ModelSpec& model) override {
    const Dtype t = dtype_;
    const int B = bytes_of(t);
    const int h = std::max(1, model.hidden);
    const int E = model.is_moe() ? model.moe.experts : 8;
    const int topk = model.is_moe() ? model.moe.top_k : 1;
    const double f = model.is_moe() ? model.moe.capacity_factor : 1.0;
    const int cmin = model.is_moe() ? model.moe.min_capacity : 4;
    const tk::GatingConfig cfg{topk, f, cmin, true};
    const auto at_least = [](double v) { return std::max<std::int64_t>(1, std::int64_t(v)); };
    Prepared p;
    p.what = std::string("kernel ") + to_string(kind);
    switch (kind) {
      case KernelKind::gating: {
        if (model.is_moe() && !model.moe.deepspeed_gating()) return router(bytes, model);
        const int T = int(at_least(bytes / (E * 4.0 + topk * 12.0)));
        const auto logits = random_vector(std::size_t(T) * E, 4, -3, 3);
        Buf dl = upload(logits, Dtype::fp32);
        auto out = std::make_shared<cu::DeviceGating>();
        p.bytes = double(T) * E * 4.0 + double(T) * topk * 12.0;
        p.run = [=] { cu::gating_forward(dl->as<float>(), T, E, cfg, *out); };
        p.check = [=] {
          p.run();
          cu::synchronize();
          tk::GatingOutput got, ref;
          out->download(got);
          tk::gating_forward(logits.data(), T, E, cfg, ref);
          std::int64_t wrong = 0;
          for (std::size_t i = 0; i < ref.expert.size(); ++i)
            wrong += got.expert[i] != ref.expert[i] || got.position[i] != ref.position[i] ||
                     std::abs(got.weight[i] - ref.weight[i]) > 1e-4f;
          return wrong;
        };
        return p;
      }
      case KernelKind::dispatch:
      case KernelKind::combine: {
        const bool is_dispatch = kind == KernelKind::dispatch;
        const double per_token = is_dispatch ? topk * (1.0 + f) : topk + 1.0;
        const int T = int(std::max<std::int64_t>(E, at_least(bytes / (per_token * h * B))));
        const auto logits = random_vector(std::size_t(T) * E, 5, -3, 3);
        auto gate = std::make_shared<tk::GatingOutput>();
        tk::gating_forward(logits.data(), T, E, cfg, *gate);
        Buf dl = upload(logits, Dtype::fp32);
        auto dg = std::make_shared<cu::DeviceGating>();
        cu::gating_forward(dl->as<float>(), T, E, cfg, *dg);
        const int C = gate->capacity;
        const std::size_t slots = std::size_t(E) * C;
        std::vector<float> hx, hbuf;
        Buf x = upload(random_vector(std::size_t(T) * h, 6), t, &hx);
        Buf buf = upload(random_vector(slots * h, 7), t, &hbuf);
        Buf out = std::make_shared<cu::DeviceBuffer>(std::size_t(T) * h * B);
        double kept = 0;
        for (int e = 0; e < E; ++e) kept += gate->kept[e];
        p.bytes = (kept + (is_dispatch ? double(slots) : double(T))) * h * B;
        if (is_dispatch) {
          p.run = [=] { cu::dispatch(t, T, topk, E, C, h, dg->expert.as<int>(), dg->position.as<int>(), x->data(), buf->data()); };
          p.check = [=] {
            p.run();
            cu::synchronize();
            std::vector<float> ref(slots * h);
            tk::dispatch(*gate, hx.data(), h, ref.data());
            return count_diff(download(*buf, t, slots * h), ref, 0);
          };
        } else {
          p.run = [=] {
            cu::combine(t, T, topk, E, C, h, dg->expert.as<int>(), dg->position.as<int>(), dg->weight.as<float>(),
                        buf->data(), out->data());
          };
          p.check = [=] {
            p.run();
            cu::synchronize();
            std::vector<float> ref(std::size_t(T) * h);
            tk::combine(*gate, hbuf.data(), h, ref.data());
            return count_diff(download(*out, t, std::size_t(T) * h), ref, 2e-2);
          };
        }
        return p;
      }
      case KernelKind::layernorm: {
        const int rows = int(at_least(bytes / (2.0 * h * B)));
        std::vector<float> hx;
        Buf x = upload(random_vector(std::size_t(rows) * h, 8), t, &hx);
        const auto g = random_vector(h, 9), be = random_vector(h, 10);
        Buf dg = upload(g, Dtype::fp32), db = upload(be, Dtype::fp32);
        Buf y = std::make_shared<cu::DeviceBuffer>(std::size_t(rows) * h * B);
        Buf mean = std::make_shared<cu::DeviceBuffer>(rows * 4), rstd = std::make_shared<cu::DeviceBuffer>(rows * 4);
        p.bytes = 2.0 * rows * h * B;
        p.run = [=] {
          cu::layernorm_forward(t, rows, h, 1e-5f, x->data(), dg->as<float>(), db->as<float>(), y->data(),
                                mean->as<float>(), rstd->as<float>());
        };
        p.check = [=] {
          p.run();
          cu::synchronize();
          std::vector<float> ref(hx.size()), m(rows), r(rows);
          tk::layernorm_forward(rows, h, 1e-5f, hx.data(), g.data(), be.data(), ref.data(), m.data(), r.data());
          return count_diff(download(*y, t, hx.size()), ref, 2e-2);
        };
        return p;
      }
      case KernelKind::activation: {
        if (model.activation == Activation::swiglu) {
          const int F = std::max(1, model.ffn);
          const int rows = int(at_least(bytes / (3.0 * F * B)));
          std::vector<float> hx;
          Buf x = upload(random_vector(std::size_t(rows) * 2 * F, 11, -4, 4), t, &hx);
          Buf y = std::make_shared<cu::DeviceBuffer>(std::size_t(rows) * F * B);
          p.bytes = 3.0 * rows * F * B;
          p.run = [=] { cu::swiglu_forward(t, rows, F, x->data(), y->data()); };
          p.check = [=] {
            p.run();
            cu::synchronize();
            std::vector<float> ref(std::size_t(rows) * F);
            tk::swiglu_forward(rows, F, hx.data(), ref.data());
            return count_diff(download(*y, t, ref.size()), ref, 2e-2);
          };
        } else {
          const std::size_t n = std::size_t(at_least(bytes / (2.0 * B)));
          std::vector<float> hx;
          Buf x = upload(random_vector(n, 12, -4, 4), t, &hx);
          Buf y = std::make_shared<cu::DeviceBuffer>(n * B);
          p.bytes = 2.0 * double(n) * B;
          p.run = [=] { cu::gelu_forward(t, n, x->data(), y->data()); };
          p.check = [=] {
            p.run();
            cu::synchronize();
            std::vector<float> ref(n);
            tk::gelu_forward(n, hx.data(), ref.data());
            return count_diff(download(*y, t, n), ref, 2e-2);
          };
        }
        return p;
      }
      case KernelKind::elementwise: {
        // No residual-add kernel on the device: the fp32 -> dtype conversion is the same kind of
        // streaming element-wise kernel (one read, one write); bytes counted as moved.
        const std::size_t n = std::size_t(at_least(bytes / (4.0 + B)));
        const auto hx = random_vector(n, 14);
        Buf x = upload(hx, Dtype::fp32);
        Buf y = std::make_shared<cu::DeviceBuffer>(n * B);
        p.bytes = double(n) * (4.0 + B);
        p.run = [=] { cu::convert_from_fp32(x->as<float>(), t, y->data(), n); };
        p.check = [=] {
          p.run();
          cu::synchronize();
          return count_diff(download(*y, t, n), hx, 1e-2);
        };
        return p;
      }
      case KernelKind::adam: {
        const std::size_t n = std::size_t(at_least(bytes / 28.0));
        const auto hp = random_vector(n, 16), hg = random_vector(n, 17), hm = random_vector(n, 18), hv = random_vector(n, 19, 0, 1);
        Buf pr = upload(hp, Dtype::fp32), g = upload(hg, Dtype::fp32), m = upload(hm, Dtype::fp32), v = upload(hv, Dtype::fp32);
        p.bytes = 28.0 * double(n);
        p.dtype = Dtype::fp32;  // fp32 master weights and moments, whatever the model trains in
        p.run = [=] { cu::adam_step(n, tk::AdamConfig{}, 1, pr->as<float>(), g->as<float>(), m->as<float>(), v->as<float>()); };
        p.check = [=] {
          pr->upload(hp.data(), n * 4);
          m->upload(hm.data(), n * 4);
          v->upload(hv.data(), n * 4);
          p.run();
          cu::synchronize();
          std::vector<float> rp = hp, rm = hm, rv = hv;
          tk::adam_step(n, tk::AdamConfig{}, 1, rp.data(), hg.data(), rm.data(), rv.data());
          return count_diff(download(*pr, Dtype::fp32, n), rp, 1e-5);
        };
        return p;
      }
      case KernelKind::cross_entropy: {
        // The step's three loss kernels (kernels/cuda/loss.cu) on fp32 logits, as the step runs
        // them; checked against the CPU passes' double reference.
        auto c = std::make_shared<CrossEntropyCase>(make_cross_entropy_case(bytes, model));
        const std::size_t n = c->logits.size();
        Buf lg = upload(c->logits, Dtype::fp32);
        auto targets = std::make_shared<cu::DeviceBuffer>(c->targets.size() * sizeof(std::int32_t));
        targets->upload(c->targets.data(), targets->bytes());
        auto stats = std::make_shared<cu::DeviceBuffer>(3 * std::size_t(c->rows) * sizeof(float));
        p.bytes = c->bytes();
        p.dtype = Dtype::fp32;  // the loss upcasts the logits whatever the model trains in
        p.run = [=] {
          float* mx = stats->as<float>();
          float *se = mx + c->rows, *tg = se + c->rows;
          const auto* ids = static_cast<const std::int32_t*>(targets->data());
          cu::ce_max_and_target(c->rows, c->cols, 0, lg->as<float>(), ids, mx, tg);
          cu::ce_exp_and_sum(c->rows, c->cols, mx, lg->as<float>(), se);
          cu::ce_gradient(c->rows, c->cols, 0, ids, se, c->scale, lg->as<float>());
        };
        p.check = [=] {
          lg->upload(c->logits.data(), n * 4);
          p.run();
          cu::synchronize();
          return count_diff(download(*lg, Dtype::fp32, n), c->reference_gradient(), 1e-4);
        };
        return p;
      }
      case KernelKind::softmax:
      case KernelKind::count: break;
    }
    return {};
  }

  std::vector<double> time(const Prepared& p, int warmup, int reps, double budget_s) override {
    for (int i = 0; i < std::max(warmup, 1); ++i) p.run();
    cu::synchronize();
    std::vector<double> out;
    double spent = 0;
    for (int i = 0; i < std::max(reps, 3); ++i) {
      timer_.start();
      p.run();
      const double s = timer_.stop();
      out.push_back(s);
      spent += s;
      if (out.size() >= 3 && spent > budget_s) break;
    }
    cu::synchronize();
    return out;
  }

 private:
  Dtype dtype_;
  std::shared_ptr<cu::BlasHandle> blas_;
  CudaEventTimer timer_;
};

}  // namespace

std::unique_ptr<Bench> make_cuda_bench(Dtype dtype) {
  if (tk::cuda_device_count() <= 0) throw RunError("no CUDA device: " + tk::describe_cuda_unavailable());
  return std::make_unique<CudaBench>(dtype);
}

}  // namespace tedsim::calibration

#else

namespace tedsim::calibration {
std::unique_ptr<Bench> make_cuda_bench(Dtype) {
  throw RunError("no CUDA device: this tedsim was built without CUDA (configure with -DTEDSIM_CUDA=ON and nvcc on PATH)");
}
}  // namespace tedsim::calibration

#endif
