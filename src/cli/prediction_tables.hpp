#pragma once
// Human-readable views of a prediction: the headline, the phase breakdown and the memory table.
#include <ostream>

#include "tedsim/search/evaluator.hpp"

namespace tedsim::cli {

void print_prediction(std::ostream& out, const Prediction& p);

}  // namespace tedsim::cli
