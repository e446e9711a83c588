#include "tedsim/profile/profile.hpp"

namespace tedsim {

const char* to_string(KernelKind kind) {
  switch (kind) {
    case KernelKind::gating: return "gating";
    case KernelKind::dispatch: return "dispatch";
    case KernelKind::combine: return "combine";
    case KernelKind::layernorm: return "layernorm";
    case KernelKind::activation: return "activation";
    case KernelKind::softmax: return "softmax";
    case KernelKind::elementwise: return "elementwise";
    case KernelKind::adam: return "adam";
    case KernelKind::count: break;
  }
  return "?";
}

const char* to_string(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_reduce: return "all_reduce";
    case CollectiveOp::all_gather: return "all_gather";
    case CollectiveOp::reduce_scatter: return "reduce_scatter";
    case CollectiveOp::all_to_all: return "all_to_all";
    case CollectiveOp::count: break;
  }
  return "?";
}

}  // namespace tedsim
