#pragma once
// The router configuration a model's MoE block asks for (kernels/cpu/router.hpp), shared by the
// training step and calibration so both run the same router.
#include "tedsim/kernels/cpu/router.hpp"
#include "tedsim/spec/model_spec.hpp"

namespace tedsim::kernels {

inline RouterConfig router_config(const MoeSpec& m) {
  RouterConfig r;
  r.kind = m.router == Router::sigmoid        ? RouterKind::sigmoid
           : m.router == Router::topk_softmax ? RouterKind::topk_softmax
                                              : RouterKind::softmax_topk;
  r.k = m.top_k;
  r.normalize = m.normalize_topk;
  r.scaling = float(m.routed_scaling);
  r.groups = m.group_limited() ? m.groups : 1;
  r.topk_groups = m.group_limited() ? m.topk_groups : 1;
  r.capacity_factor = m.capacity_factor;
  r.min_capacity = m.min_capacity;
  r.drop_tokens = !m.dropless();
  return r;
}

}  // namespace tedsim::kernels
