#include "tedsim/calibration/machine_speed.hpp"

#include <numeric>

#include <nlohmann/json.hpp>

#include "tedsim/calibration/point_timing.hpp"

namespace tedsim::calibration {

std::unique_ptr<MachineSpeedProbe> MachineSpeedProbe::for_profile(Backend backend, const ProfileData& profile) {
  if (profile.calibration_json.empty()) return nullptr;
  const nlohmann::json calib = nlohmann::json::parse(profile.calibration_json, nullptr, false);
  if (!calib.is_object() || !calib.contains("drift") || !calib["drift"].is_object()) return nullptr;
  const nlohmann::json& drift = calib["drift"];
  const nlohmann::json g = drift.value("gemm", nlohmann::json());
  const double before = drift.value("before_s", 0.0), after = drift.value("after_s", 0.0);
  if (!g.is_array() || g.size() != 4 || !(before > 0) || !(after > 0)) return nullptr;
  for (const nlohmann::json& d : g)
    if (!d.is_number_integer() || d.get<std::int64_t>() <= 0) return nullptr;
  std::unique_ptr<MachineSpeedProbe> probe(new MachineSpeedProbe);
  SpeedCheck& base = probe->base_;
  base.gemm = GemmShape{g[0].get<std::int64_t>(), g[1].get<std::int64_t>(), g[2].get<std::int64_t>(),
                        g[3].get<std::int64_t>(), Dtype::fp32, drift.value("grouped", false)};
  for (const GemmPoint& p : profile.gemms)  // the dtype calibration timed it in: its own point's
    if (p.shape.m == base.gemm.m && p.shape.n == base.gemm.n && p.shape.k == base.gemm.k &&
        p.shape.batch == base.gemm.batch && p.shape.grouped == base.gemm.grouped)
      base.gemm.dtype = p.shape.dtype;
  base.calibrated_s = 0.5 * (before + after);
  probe->bench_ = backend == Backend::cuda ? make_cuda_bench(base.gemm.dtype) : make_cpu_bench();
  probe->gemm_ = probe->bench_->gemm(base.gemm);
  probe->bench_->time(probe->gemm_, 2, 3, 0.05);  // the process's first GEMM runs cold: not a speed
  return probe;
}

void MachineSpeedProbe::time_now(Communicator& world) {
  // A full calibration's repetitions, as calibrate times the sentinel.
  now_s_.push_back(
      measure_steady([&] { return slowest(world, summarize(bench_->time(gemm_, 2, 20, 0.3))); }, 1.5).median_s);
}

std::optional<SpeedCheck> MachineSpeedProbe::check() const {
  if (now_s_.empty()) return std::nullopt;
  SpeedCheck c = base_;
  c.now_s = std::accumulate(now_s_.begin(), now_s_.end(), 0.0) / double(now_s_.size());
  return c;
}

}  // namespace tedsim::calibration
