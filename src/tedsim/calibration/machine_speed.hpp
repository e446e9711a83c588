#pragma once
// How this machine's speed compares with the minutes a profile was measured in. Calibration times
// a sentinel GEMM before its first point and after its last (calibration.drift in the profile);
// timing it again right before a run says whether the machine has since sped up or slowed down,
// which a shared host does (the CPU validation matrix once ran every row of a profile 56-87% slower
// than predicted: the profile was measured in a slow minute). A prediction describes the machine as
// it was when measured.
#include <optional>

#include "tedsim/comm/communicator.hpp"
#include "tedsim/profile/measured_profile.hpp"

namespace tedsim::calibration {

struct SpeedCheck {
  GemmShape gemm;
  double calibrated_s = 0;  // the sentinel at calibration: the mean of its two timings
  double now_s = 0;         // the slowest rank's median now
  double change() const { return now_s / calibrated_s - 1; }
};

// Beyond this change the run warns that the prediction is for another speed: calibration itself
// sees the sentinel move by up to 30% within seconds on a shared VM (calibrate.cpp's kDriftLimit: 35%).
inline constexpr double kSpeedChangeLimit = 0.35;

// The profile's sentinel GEMM timed on every rank of `world` (collective; the slowest rank's
// median). None when the profile has no sentinel (written before it was recorded, or with no GEMMs).
std::optional<SpeedCheck> recheck_sentinel(Communicator& world, Backend backend, const ProfileData& profile);

}  // namespace tedsim::calibration
