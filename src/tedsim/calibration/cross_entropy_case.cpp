#include "tedsim/calibration/cross_entropy_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "tedsim/calibration/bench.hpp"

namespace tedsim::calibration {

CrossEntropyCase make_cross_entropy_case(double bytes, const ModelSpec& model) {
  CrossEntropyCase c;
  c.cols = std::max(16, model.vocab);
  c.rows = int(std::max(1.0, std::floor(bytes / (20.0 * c.cols))));
  c.logits = random_vector(std::size_t(c.rows) * std::size_t(c.cols), 20, -5, 5);
  c.targets.resize(std::size_t(c.rows));
  for (int i = 0; i < c.rows; ++i) c.targets[std::size_t(i)] = std::int32_t((7919LL * i + 13) % c.cols);
  c.scale = 1.0f / float(c.rows);
  return c;
}

std::vector<float> CrossEntropyCase::reference_gradient() const {
  std::vector<float> g(logits.size());
  for (int i = 0; i < rows; ++i) {
    const float* row = logits.data() + std::size_t(i) * std::size_t(cols);
    const double m = *std::max_element(row, row + cols);
    double sum = 0;
    for (int v = 0; v < cols; ++v) sum += std::exp(double(row[v]) - m);
    for (int v = 0; v < cols; ++v) {
      double x = std::exp(double(row[v]) - m) / sum * scale;
      if (v == targets[std::size_t(i)]) x -= scale;
      g[std::size_t(i) * std::size_t(cols) + std::size_t(v)] = float(x);
    }
  }
  return g;
}

}  // namespace tedsim::calibration
