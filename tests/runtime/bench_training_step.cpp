// Google Benchmark: the CPU training step's model FLOP/s against Eigen's GEMM FLOP/s at the model's
// main shapes, in the same run. The model (hidden 512, ffn 2048, seq 256, 8 heads, 4 experts top-1,
// 2 layers: dense + MoE, vocab 4096) is big enough that GEMMs dominate; the ratio (target >= 50%)
// says how much of the step is GEMM at Eigen's speed rather than overhead (attention, softmax,
// norms, permutations, collectives, optimizer).
//
// Model FLOPs: 3x the forward (backward = 2x) of every GEMM the step executes (expert GEMMs over
// the E*C capacity rows), plus attention scores/context over full s x s per head. No recompute:
// the step runs without activation checkpointing here.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <chrono>
#include <memory>
#include <vector>

#include "tedsim/comm/communicator.hpp"
#include "tedsim/kernels/cpu/gemm.hpp"
#include "tedsim/runtime/trainer.hpp"

namespace {

using namespace tedsim;

ModelSpec bench_model() {
  ModelSpec m;
  m.name = "bench-moe";
  m.layers = 2;
  m.hidden = 512;
  m.heads = 8;
  m.kv_heads = 8;
  m.ffn = 2048;
  m.vocab = 4096;
  m.seq_len = 256;
  m.dtype = Dtype::fp32;
  m.moe.experts = 4;
  m.moe.every = 2;
  m.moe.top_k = 1;
  m.moe.capacity_factor = 1.0;
  m.moe.min_capacity = 4;
  return m;
}

struct Shape {
  int m, n, k;
};

// The forward GEMMs of one micro-batch of b sequences (T = b*s rows).
std::vector<Shape> forward_gemms(const ModelSpec& m, int b, int capacity) {
  const int T = b * m.seq_len, h = m.hidden, F = m.ffn;
  std::vector<Shape> g;
  for (int l = 0; l < m.layers; ++l) {
    g.push_back({T, h + 2 * m.kv_dim(), h});
    g.push_back({T, h, h});
    if (m.is_moe_layer(l)) {
      g.push_back({T, m.moe.experts, h});
      for (int x = 0; x < m.moe.experts; ++x) {
        g.push_back({capacity, F, h});
        g.push_back({capacity, h, F});
      }
    } else {
      g.push_back({T, F, h});
      g.push_back({T, h, F});
    }
  }
  g.push_back({T, m.vocab, h});
  return g;
}

double model_flops(const ModelSpec& m, int b, int capacity) {
  double f = 0;
  for (const Shape& s : forward_gemms(m, b, capacity)) f += kernels::gemm_flops(s.m, s.n, s.k);
  f += m.layers * 2.0 * (2.0 * b * m.seq_len * m.seq_len * m.hidden);  // QK^T and PV
  return 3.0 * f;
}

// Eigen GEMM rate at the step's shapes, each shape in the orientations the step uses (forward A B,
// backward A B^T and A^T B), weighted by FLOPs: total FLOPs / total best time.
double gemm_rate(const ModelSpec& m, int b, int capacity) {
  double flops = 0, seconds = 0;
  for (const Shape& s : forward_gemms(m, b, capacity)) {
    std::vector<float> a(static_cast<std::size_t>(s.m) * s.k, 0.01f), bm(static_cast<std::size_t>(s.k) * s.n, 0.02f),
        c(static_cast<std::size_t>(s.m) * s.n), dc(static_cast<std::size_t>(s.m) * s.n, 0.01f);
    std::vector<float> da(a.size()), db(bm.size());
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      kernels::gemm({false, false, 1, 0}, s.m, s.n, s.k, a.data(), s.k, bm.data(), s.n, c.data(), s.n);
      kernels::gemm({false, true, 1, 0}, s.m, s.k, s.n, dc.data(), s.n, bm.data(), s.n, da.data(), s.k);
      kernels::gemm({true, false, 1, 1}, s.k, s.n, s.m, a.data(), s.k, dc.data(), s.n, db.data(), s.n);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    flops += 3 * kernels::gemm_flops(s.m, s.n, s.k);
    seconds += best;
  }
  return flops / seconds;
}

std::unique_ptr<Communicator> g_world;

void BM_TrainingStep(benchmark::State& state) {
  const ModelSpec m = bench_model();
  ParallelConfig c;
  c.gpus = 1;
  c.micro_batch = static_cast<int>(state.range(0));
  c.global_batch = c.micro_batch;
  c.recompute = Recompute::none;
  c.cac = false;
  c.zero = 0;
  runtime::Trainer trainer(*g_world, m, c, runtime::TrainerOptions{});
  trainer.step();  // warm-up: buffers allocated, pages touched
  const double flops = model_flops(m, c.micro_batch, trainer.capacity());
  const double gemm = gemm_rate(m, c.micro_batch, trainer.capacity());
  double step_s = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const runtime::StepStats st = trainer.step();
    step_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(st.loss);
  }
  const double step_rate = flops * static_cast<double>(state.iterations()) / step_s;
  state.counters["model_GFLOP"] = flops / 1e9;
  state.counters["step_GFLOPs"] = step_rate / 1e9;
  state.counters["gemm_GFLOPs"] = gemm / 1e9;
  state.counters["ratio"] = step_rate / gemm;  // target >= 0.5
}
BENCHMARK(BM_TrainingStep)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  benchmark::Initialize(&argc, argv);
  g_world = make_world_communicator(Backend::cpu);
  benchmark::RunSpecifiedBenchmarks();
  g_world.reset();
  benchmark::Shutdown();
  MPI_Finalize();
  return 0;
}
