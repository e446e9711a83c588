#include "tedsim/spec/expert_shares.hpp"

#include <algorithm>
#include <cmath>

namespace tedsim {

double ExpertShares::busiest_rank_load(int ep) const {
  if (passes.empty() || ep <= 1) return 1.0;
  const int E = experts();
  if (E % ep != 0) return 1.0;  // no such layout (validate_config rejects it)
  const int local = E / ep;
  double sum = 0;
  for (const std::vector<double>& pass : passes) {
    double busiest = 0;
    for (int r = 0; r < ep; ++r) {
      double rank = 0;
      for (int x = 0; x < local; ++x) rank += pass[std::size_t(r * local + x)];
      busiest = std::max(busiest, rank);
    }
    sum += busiest * ep;
  }
  return std::max(1.0, sum / double(passes.size()));
}

double ExpertShares::imbalance() const {
  if (passes.empty()) return 1.0;
  double sum = 0;
  for (const std::vector<double>& pass : passes) sum += *std::max_element(pass.begin(), pass.end()) * double(pass.size());
  return std::max(1.0, sum / double(passes.size()));
}

std::vector<double> shares_of(const std::vector<std::int64_t>& rows) {
  double total = 0;
  for (std::int64_t r : rows) total += double(r);
  if (total <= 0) return {};
  std::vector<double> shares;
  shares.reserve(rows.size());
  for (std::int64_t r : rows) shares.push_back(double(r) / total);
  return shares;
}

std::string expert_shares_problem(const ExpertShares& shares, int experts) {
  for (std::size_t i = 0; i < shares.passes.size(); ++i) {
    const std::vector<double>& pass = shares.passes[i];
    const std::string where = "pass " + std::to_string(i) + ": ";
    if (int(pass.size()) != experts)
      return where + std::to_string(pass.size()) + " shares for a model of " + std::to_string(experts) + " routed experts";
    double sum = 0;
    for (double s : pass) {
      if (!std::isfinite(s) || s < 0) return where + "expected shares >= 0";
      sum += s;
    }
    if (std::fabs(sum - 1.0) > 1e-6) return where + "the shares sum to " + std::to_string(sum) + ", expected 1";
  }
  return "";
}

}  // namespace tedsim
