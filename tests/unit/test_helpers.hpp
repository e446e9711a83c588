#pragma once
// Loading shipped specs by name and building predictions in one line, for tests.
#include <cstring>
#include <string>

#include "tedsim/profile/analytic_profile.hpp"
#include "tedsim/search/evaluator.hpp"
#include "tedsim/spec/data_files.hpp"

namespace tedsim::test {

inline ModelSpec model(const std::string& name) { return load_model(resolve_data_file("models", name)); }
inline TopologySpec topology(const std::string& name) {
  return load_topology(resolve_data_file("topologies", name));
}

inline ParallelConfig config(int gpus, int tp, int ep, int micro_batch, int global_batch) {
  ParallelConfig c;
  c.gpus = gpus;
  c.tp = tp;
  c.ep = ep;
  c.micro_batch = micro_batch;
  c.global_batch = global_batch;
  return c;
}

// Seconds of the ops of `b` named `name`, summed.
inline double op_seconds(const Block& b, const char* name) {
  double s = 0;
  for (int i = 0; i < b.count; ++i)
    if (std::strcmp(b.ops[i].name, name) == 0) s += b.ops[i].seconds;
  return s;
}

// The first op of `b` named `name`, or nullptr.
inline const Op* find_op(const Block& b, const char* name) {
  for (int i = 0; i < b.count; ++i)
    if (std::strcmp(b.ops[i].name, name) == 0) return &b.ops[i];
  return nullptr;
}

// Everything a prediction needs, kept alive together.
struct Bench {
  ModelSpec m;
  TopologySpec topo;
  AnalyticProfile profile;
  Evaluator evaluator;
  Bench(ModelSpec model_spec, const std::string& topo_name)
      : m(std::move(model_spec)), topo(topology(topo_name)), profile(topo), evaluator(m, topo, profile) {}
  Workload workload(const ParallelConfig& c) const {
    return build_workload(m, c, profile, evaluator.spans_for(c));
  }
};

}  // namespace tedsim::test
