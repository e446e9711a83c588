#include "tedsim/runtime/param_registrar.hpp"

namespace tedsim::runtime {

int ParamRegistrar::add(const std::string& name, const std::string& kind, int tensor_id, bool expert,
                        bool tp_replicated, Slice sl, float mean, float stdv, bool copy) {
  ParamInfo p;
  p.name = name;
  p.kind = kind;
  p.tensor_id = tensor_id;
  p.expert = expert;
  p.tp_replicated = tp_replicated;
  p.tp_partial_grad = tp_replicated && tp_partial_;
  p.unit = unit_;
  if (expert)
    p.primary = expert_data_rank_ == 0;
  else
    p.primary = data_rank_ == 0 && (!tp_replicated || tensor_rank_ == 0);
  if (copy) p.primary = false;
  p.slice = std::move(sl);
  p.mean = mean;
  p.std = stdv;
  return store_.add(std::move(p));
}

int ParamRegistrar::add_vector(const std::string& name, const std::string& kind, int tensor_id, int width, float mean,
                               float stdv) {
  return add(name, kind, tensor_id, false, true, slice(1, 1, width, 0, 1, 0, 1, {{0, width}}), mean, stdv);
}

Slice ParamRegistrar::slice(int A, int R, int C, int a0, int a1, int r0, int r1, std::vector<std::pair<int, int>> cols) {
  return Slice{A, R, C, a0, a1, r0, r1, std::move(cols)};
}

}  // namespace tedsim::runtime
