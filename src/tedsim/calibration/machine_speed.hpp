#pragma once
// How this machine's speed compares with the minutes a profile was measured in. Calibration times
// a sentinel GEMM before its first point and after its last (calibration.drift in the profile);
// timing it again around a run says whether the machine has since sped up or slowed down, which a
// shared host does (the CPU validation matrix once ran every row of a profile 56-87% slower than
// predicted: the profile was measured in a slow minute). A prediction describes the machine as it
// was when measured.
#include <memory>
#include <optional>
#include <vector>

#include "tedsim/calibration/bench.hpp"
#include "tedsim/comm/communicator.hpp"
#include "tedsim/profile/measured_profile.hpp"

namespace tedsim::calibration {

struct SpeedCheck {
  GemmShape gemm;
  double calibrated_s = 0;  // the sentinel at calibration: the mean of its two timings
  double now_s = 0;         // the mean of the probe's timings (slowest rank's medians)
  double change() const { return now_s / calibrated_s - 1; }
};

// Beyond this change a run warns that its prediction is for another speed: calibration sees the
// sentinel move by up to 30% within seconds on a shared VM (calibrate.cpp's kDriftLimit, 35%).
inline constexpr double kSpeedChangeLimit = 0.35;

// The profile's sentinel GEMM, prepared on this rank's device, timed when asked.
class MachineSpeedProbe {
 public:
  // None when the profile has no sentinel (written before it was recorded, or with no GEMMs).
  static std::unique_ptr<MachineSpeedProbe> for_profile(Backend backend, const ProfileData& profile);
  // Times the sentinel on every rank of `world` (collective): the slowest rank's median, measured
  // again while its repetitions spread by more than 1.5x, as calibration measures its points.
  void time_now(Communicator& world);
  // The mean of the timings so far against calibration's (none before the first time_now).
  std::optional<SpeedCheck> check() const;

 private:
  MachineSpeedProbe() = default;
  SpeedCheck base_;
  std::unique_ptr<Bench> bench_;
  Prepared gemm_;
  std::vector<double> now_s_;
};

}  // namespace tedsim::calibration
