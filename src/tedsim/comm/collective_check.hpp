#pragma once
// Check-and-time one collective, nccl-tests style: fill with rank-dependent values, warm up, time
// every repetition on the backend's clock, check the result, count wrong elements. Calibration
// uses it to measure collectives on TED-shaped groups; the tests use it to prove correctness.
// Run on a group communicator by every member; when every rank calls it on its own group of one
// kind, all groups of that kind run at once (as in a TED step, where they share links).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tedsim/profile/collective_table.hpp"
#include "tedsim/comm/communicator.hpp"

namespace tedsim {

struct CollectiveCase {
  CollectiveOp op = CollectiveOp::all_reduce;
  // nccl-tests count: elements of the buffer that "size" describes (the all-reduce buffer,
  // all-gather output, reduce-scatter input, all-to-all send buffer); rounded down to a multiple
  // of the group size for the three rank-split collectives.
  std::int64_t count = 0;
  Dtype dtype = Dtype::fp32;
  ReduceOp redop = ReduceOp::sum;  // all_reduce and reduce_scatter only
  bool in_place = false;           // not for all_to_all(_v) or send_recv
  // all_to_all_v: the busiest rank's share over the mean rank's, L (1 <= L <= n). Rank 0 is the
  // busiest: every rank sends it count / n elements; every other rank j receives
  // count / n x (n - L) / (L (n - 1)) from each (rounded down), as dropless routing spreads the
  // rest of the tokens evenly. L = 1 is an even exchange through the all-to-all-v call.
  double busiest_load = 1.0;
  int warmup = 2;                  // untimed repetitions first (connection setup, caches)
  int iters = 10;                  // timed repetitions
  // Run on every rank before each timed repetition, outside the timing (calibration on CPU: push
  // the buffers out of the caches, as the step finds them).
  std::function<void()> before_each;
};

struct CollectiveResult {
  CollectiveOp op = CollectiveOp::all_reduce;
  Dtype dtype = Dtype::fp32;
  ReduceOp redop = ReduceOp::sum;
  bool in_place = false;
  std::string group;  // the communicator's name
  int ranks = 1;      // group size n
  std::int64_t count = 0;  // nccl-tests count, after rounding
  std::int64_t bytes = 0;  // count * element size: the nccl-tests "size"
  // Per repetition, the slowest rank's time (a collective is done when its last rank is).
  double time_median_s = 0, time_min_s = 0, time_max_s = 0;
  double algbw_gbs = 0;  // bytes / median time, decimal GB/s
  double busbw_gbs = 0;  // algbw * bus_bandwidth_factor(op, ranks)
  std::int64_t wrong = 0;  // elements differing from the expected result, summed over the group
  int groups = 1;          // groups of this kind that ran at once (check_and_time_groups)
};

// The check's data, exposed for tests: input element i of rank r in a group of n, and the largest
// |output - expected| still counted right (0 wherever the result must be exact).
float collective_input_value(const CollectiveCase& c, int n, int r, std::int64_t i);
double collective_tolerance(const CollectiveCase& c, int n);

// all_to_all_v's elements every rank sends to rank j (the same from every rank), per CollectiveCase.
std::vector<std::size_t> all_to_all_v_counts(const CollectiveCase& c, int n);

// Collective over `comm`. Throws InputError for an impossible case (in-place all-to-all, max with
// a collective that does not reduce, negative count or iterations, an all-to-all-v load outside
// [1, n]), RunError from the backend.
CollectiveResult check_and_time(Communicator& comm, const CollectiveCase& c);

// Every group of one kind at once (all TP groups, all expert groups, ...): each rank passes its own
// `group`, split from `world`. Collective over `world`; every timed repetition starts with a world
// barrier, so the groups' repetitions overlap (contention as in a step). The result is the same on every rank: the
// slowest group's times (it sets the pace of a TED step), bandwidths from those, #wrong summed
// over all groups, and `groups` = how many ran.
CollectiveResult check_and_time_groups(Communicator& world, Communicator& group,
                                       const CollectiveCase& c);

// nccl-tests sweep: counts of `dtype` elements from min_bytes to max_bytes, each step
// multiplying the size by `factor` (> 1); max_bytes is always included.
std::vector<std::int64_t> sweep_counts(std::int64_t min_bytes, std::int64_t max_bytes,
                                       double factor, Dtype dtype);

// nccl-tests table: a "#" header naming op and group, then one row per result:
//   size count type redop time algbw busbw #wrong   (time in microseconds, median).
std::string nccl_table_header(const CollectiveResult& first);
std::string nccl_table_row(const CollectiveResult& r);
// Whole table; a new header starts whenever op, group or group size changes.
std::string format_nccl_table(const std::vector<CollectiveResult>& results);

}  // namespace tedsim
