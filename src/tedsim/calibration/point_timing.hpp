#pragma once
// Pieces every calibration run shares (calibrate's sweep, validate --calibrate's missing points):
// the hosts of the world, a point's timing summarized and taken from the slowest rank, steady
// re-measurement, and rank-0 file work whose failure every rank learns of.
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "tedsim/calibration/bench.hpp"
#include "tedsim/comm/communicator.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/profile/measured_profile.hpp"

namespace tedsim::calibration {

// Host names of every rank (MPI), distinct in rank order, the most ranks on one host and the MPI
// library. Collective over MPI_COMM_WORLD; InputError unless ranks are placed in blocks.
void gather_hosts(Provenance& p);

// Everything a profile records of the run that measures it: the hosts (gather_hosts, so
// collective), backend, CPU, `bench`'s device, the date, tedsim's build and the CUDA versions.
Provenance describe_this_run(Backend backend, const Bench& bench);

// Throws RunError on every rank unless no rank's kernel differed from its CPU reference: a wrong
// kernel is not timed.
void require_correct(Communicator& world, std::int64_t wrong, const std::string& what);

// min / median / max of repetitions.
Timing summarize(std::vector<double> seconds);

// The slowest rank's timing (a step waits for its slowest rank); identical on every rank.
Timing slowest(Communicator& world, const Timing& t);

// Times a point with re-measurement: a point whose spread (max/min, slowest rank) is above
// `spread_limit` is measured again, at most twice; the tightest attempt is kept. Decided on
// reduced values, so every rank makes the same choice.
Timing measure_steady(const std::function<Timing()>& once, double spread_limit);

// File work that only rank 0 does (reading the partial profile, writing it and the final one),
// with its outcome shared: if it throws, rank 0 rethrows and every other rank throws an error of
// the same kind, instead of waiting forever in the next collective while rank 0 exits.
template <class Work>
void on_root(Communicator& world, bool root, Work&& work) {
  std::exception_ptr error;
  double code = 0;  // ExitCode of rank 0's error, 0 if none
  if (root) {
    try {
      work();
    } catch (const Error& e) {
      error = std::current_exception();
      code = double(int(e.code()));
    } catch (const std::exception&) {
      error = std::current_exception();
      code = double(int(ExitCode::failure));
    }
  }
  std::vector<double> v{code};
  world.host_max(v);
  if (v[0] == 0) return;
  if (error) std::rethrow_exception(error);
  const std::string why = "rank 0 could not read or write the profile (its message says why)";
  if (v[0] == double(int(ExitCode::bad_input))) throw InputError(why);
  throw RunError(why);
}

}  // namespace tedsim::calibration
