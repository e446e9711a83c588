#pragma once
// A piecewise curve y(x) interpolated linearly in log(x), clamped outside its points. Used for
// efficiency curves (analytic profile). Log-x keeps the points sparse over many decades of sizes.
#include <utility>
#include <vector>

namespace tedsim {

class LogCurve {
 public:
  LogCurve() = default;
  explicit LogCurve(const std::vector<std::pair<double, double>>& points);
  double operator()(double x) const;
  bool empty() const { return log_x_.empty(); }

 private:
  std::vector<double> log_x_;
  std::vector<double> y_;
};

}  // namespace tedsim
