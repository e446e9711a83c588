#include "tedsim/calibration/machine_speed.hpp"

#include <nlohmann/json.hpp>

#include "tedsim/calibration/point_timing.hpp"

namespace tedsim::calibration {

std::optional<SpeedCheck> recheck_sentinel(Communicator& world, Backend backend, const ProfileData& profile) {
  if (profile.calibration_json.empty()) return std::nullopt;
  const nlohmann::json calib = nlohmann::json::parse(profile.calibration_json, nullptr, false);
  if (!calib.is_object() || !calib.contains("drift")) return std::nullopt;
  const nlohmann::json& drift = calib["drift"];
  const nlohmann::json& g = drift.value("gemm", nlohmann::json());
  const double before = drift.value("before_s", 0.0), after = drift.value("after_s", 0.0);
  if (!g.is_array() || g.size() != 4 || !(before > 0) || !(after > 0)) return std::nullopt;
  for (const nlohmann::json& d : g)
    if (!d.is_number_integer()) return std::nullopt;
  SpeedCheck check;
  check.gemm = GemmShape{g[0].get<std::int64_t>(), g[1].get<std::int64_t>(), g[2].get<std::int64_t>(),
                         g[3].get<std::int64_t>(), Dtype::fp32, drift.value("grouped", false)};
  if (check.gemm.m <= 0 || check.gemm.n <= 0 || check.gemm.k <= 0 || check.gemm.batch <= 0) return std::nullopt;
  // The dtype calibration timed it in: its own point's.
  for (const GemmPoint& p : profile.gemms)
    if (p.shape.m == check.gemm.m && p.shape.n == check.gemm.n && p.shape.k == check.gemm.k &&
        p.shape.batch == check.gemm.batch)
      check.gemm.dtype = p.shape.dtype;
  check.calibrated_s = 0.5 * (before + after);
  std::unique_ptr<Bench> bench = backend == Backend::cuda ? make_cuda_bench(check.gemm.dtype) : make_cpu_bench();
  const Prepared p = bench->gemm(check.gemm);
  // As calibrate times it: one untimed round first (the process's first GEMM runs cold), then a
  // full calibration's repetitions.
  bench->time(p, 2, 3, 0.05);
  check.now_s = slowest(world, summarize(bench->time(p, 2, 20, 0.3))).median_s;
  return check;
}

}  // namespace tedsim::calibration
