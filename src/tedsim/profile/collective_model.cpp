#include "tedsim/profile/collective_model.hpp"

namespace tedsim {

double bus_bandwidth_factor(CollectiveOp op, int ranks) {
  if (ranks <= 1) return 0.0;
  const double n = ranks;
  return op == CollectiveOp::all_reduce ? 2.0 * (n - 1.0) / n : (n - 1.0) / n;
}

}  // namespace tedsim
