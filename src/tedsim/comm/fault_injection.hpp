#pragma once
// --inject-fault: a testing aid that makes one rank misbehave at a chosen step, so the watchdog's
// behaviour can be tested under a real launcher. "hang:RANK[:STEP]" stops the rank outside any
// collective (it sleeps, alive, until the job is ended); "exit:RANK[:STEP]" ends the process at
// once, without MPI_Finalize, as a crash would. STEP counts from 1: training steps in validate
// (warm-up included), measured points in calibrate; without it, the first.
#include <string>

namespace tedsim {

struct FaultInjection {
  enum class Kind { none, hang, exit };
  Kind kind = Kind::none;
  int rank = 0;
  int step = 1;
  bool active() const { return kind != Kind::none; }
};

// Throws InputError naming the flag and the expected form.
FaultInjection parse_fault_injection(const std::string& text);
std::string to_string(const FaultInjection& fault);  // "hang:1:2", or "none"

}  // namespace tedsim
