// Configuration evaluations per second (workload + timeline + memory) on one core, and the
// wall time of the default search (ted-6.7b with 16 experts on 128 Summit GPUs, batch 1024).
// Targets: >= 100,000 evaluations/s; default search < 1 s.
#include <benchmark/benchmark.h>

#include "tedsim/profile/analytic_profile.hpp"
#include "tedsim/search/search.hpp"
#include "tedsim/spec/data_files.hpp"

namespace {

using namespace tedsim;

struct DefaultInputs {
  ModelSpec model = load_model(resolve_data_file("models", "ted-6.7b"));
  TopologySpec topology = load_topology(resolve_data_file("topologies", "summit"));
  AnalyticProfile profile{topology};
  SearchSpace space() const {
    SearchSpace s;
    s.gpus = 128;
    s.global_batch = 1024;
    return s;
  }
};

const DefaultInputs& inputs() {
  static const DefaultInputs in;
  return in;
}

void BM_EvaluateConfiguration(benchmark::State& state) {
  const DefaultInputs& in = inputs();
  const Evaluator evaluator(in.model, in.topology, in.profile);
  const std::vector<ParallelConfig> configs = enumerate_configs(in.model, in.space());
  // A stride through the whole space (prime to its size), so every part of it is sampled: the
  // enumeration is ordered by pipeline degree, whose timelines cost the most.
  const std::size_t stride = 7919;
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(evaluator.evaluate(configs[i]));
    i = (i + stride) % configs.size();
  }
  state.counters["evaluations_per_s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EvaluateConfiguration);

void BM_DefaultSearch(benchmark::State& state) {
  const DefaultInputs& in = inputs();
  long long evaluated = 0;
  for (auto _ : state) {
    const Evaluator evaluator(in.model, in.topology, in.profile);
    const SearchResult r = run_search(evaluator, in.space(), 10);
    evaluated += r.evaluated;
    benchmark::DoNotOptimize(r);
  }
  state.counters["configs"] = double(evaluated) / double(state.iterations());
  state.counters["evaluations_per_s"] = benchmark::Counter(double(evaluated), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DefaultSearch)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
