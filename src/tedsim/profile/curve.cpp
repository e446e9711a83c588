#include "tedsim/profile/curve.hpp"

#include <cmath>

namespace tedsim {

LogCurve::LogCurve(const std::vector<std::pair<double, double>>& points) {
  for (const auto& [x, y] : points) {
    log_x_.push_back(std::log(x));
    y_.push_back(y);
  }
}

double LogCurve::operator()(double x) const {
  const double lx = std::log(x > 0 ? x : 1e-300);
  if (lx <= log_x_.front()) return y_.front();
  if (lx >= log_x_.back()) return y_.back();
  std::size_t i = 1;
  while (log_x_[i] < lx) ++i;
  const double w = (lx - log_x_[i - 1]) / (log_x_[i] - log_x_[i - 1]);
  return y_[i - 1] + w * (y_[i] - y_[i - 1]);
}

}  // namespace tedsim
