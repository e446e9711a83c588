#pragma once
// The collective watchdog of calibrate and validate. A rank that hangs or dies would otherwise hold
// every other rank inside its next collective forever, on machines that cost by the hour.
//
// Every blocking call of a communicator (collectives, receives, waits for sends, splits, host
// reductions) is bracketed by a WatchedCall. A thread of the watchdog checks the open call every
// few milliseconds; when one has lasted longer than the timeout, it asks every rank for its state
// over a private communicator (a census: what each rank is inside, since when, at which step) and
// the lowest rank that timed out prints one message naming the call, the group, and each member
// that did not arrive with its host and what it was doing instead (or that it did not answer: dead
// or stopped), then ends every rank with MPI_Abort (exit code 1). NCCL communicators are aborted
// first (ncclCommAbort, as PyTorch's watchdog does) through abort hooks.
//
// The collectives themselves stay blocking MPI calls: MPI's non-blocking collectives run other
// algorithms (measured here: allgather 1.3-4.7x slower on two ranks), and calibration must time
// what a training step calls. The census runs on the watchdog thread, so it needs
// MPI_THREAD_MULTIPLE; without it the watchdog still ends the job, naming only its own call.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tedsim/comm/fault_injection.hpp"

namespace tedsim {

constexpr double kDefaultCollectiveTimeoutS = 300;

struct WatchdogOptions {
  double timeout_s = kDefaultCollectiveTimeoutS;  // 0: no watchdog
  FaultInjection fault;
};

namespace watchdog {

// Collective over MPI_COMM_WORLD (MPI initialised). Throws InputError for a fault naming a rank
// the world does not have. A timeout of 0 starts nothing (the fault still applies).
void start(const WatchdogOptions& options);
// Stops the thread; every rank calls it before MPI_Finalize. Safe when never started.
void stop();
bool running();
double timeout_s();

// Step `n` (from 1) begins: recorded for the census, and where --inject-fault strikes.
void at_step(long n);

// One blocking call, as the census reports it. `op` is a literal; `group` and `members` (the
// group's world ranks, in group order) belong to the communicator and outlive the call.
struct CallSite {
  const char* op;
  const std::string* group;
  const std::vector<int>* members;
  int group_rank = 0, group_size = 1;
  std::uint64_t number = 0;  // this call's number on its communicator, from 1
};

// Brackets one blocking call; nested calls (a split's own check) count as the outer one.
class WatchedCall {
 public:
  explicit WatchedCall(const CallSite& site);
  ~WatchedCall();
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  bool outer_ = false;
};

// Run (on the watchdog thread) before the job is ended; returns an id for remove_abort_hook.
int add_abort_hook(std::function<void()> hook);
void remove_abort_hook(int id);

// "0,1,2,3", or the first ranks and a count for large groups.
std::string members_text(const std::vector<int>& world_ranks);

}  // namespace watchdog
}  // namespace tedsim
