#include "tedsim/calibration/provenance.hpp"

namespace tedsim::calibration {
void add_cuda_provenance(Provenance&) {}
}  // namespace tedsim::calibration
