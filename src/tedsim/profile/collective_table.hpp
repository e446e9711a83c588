#pragma once
// The collective table: what "bytes" and "busbw" mean for each collective, in one place so that
// calibration (which measures) and the cost model (which predicts) can never disagree.
// Header-only and free of MPI/CUDA on purpose: the cost model may include it without depending on
// the comm library. Definitions follow nccl-tests (doc/PERFORMANCE.md there).
#include <cstdint>

#include "tedsim/profile/profile.hpp"

namespace tedsim {

// busbw = algbw * factor. The factor turns the algorithm bandwidth (bytes / time) into the
// bandwidth each link must carry in an optimal ring, so numbers compare across group sizes:
//   all-reduce                               2(n-1)/n  (a reduce-scatter then an all-gather)
//   all-gather, reduce-scatter, all-to-all    (n-1)/n  (each rank moves all but its own share)
//   send-recv                                 1        (each rank's whole message crosses one link)
// n <= 1 moves nothing over a link: the factor is 0.
constexpr double bus_bandwidth_factor(CollectiveOp op, int n) {
  if (n <= 1) return 0.0;
  const double share = double(n - 1) / double(n);
  switch (op) {
    case CollectiveOp::all_reduce: return 2.0 * share;
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter:
    case CollectiveOp::all_to_all:
    case CollectiveOp::all_to_all_v: return share;
    case CollectiveOp::send_recv: return 1.0;
    case CollectiveOp::count: break;
  }
  return 0.0;
}

// nccl-tests "count" is the element count of its "size" column, which is the per-rank buffer of:
//   all-reduce: the (in = out) buffer; all-gather: the output; reduce-scatter: the input;
//   all-to-all: the whole send buffer; all-to-all-v: the busiest rank's receive buffer (its
//   chunk from each rank; the others receive less); send-recv: the message to the next stage.
// The communicator API instead takes the per-rank chunk for the three rank-split collectives;
// these convert between the two views. `count` must be a multiple of n for those three.
constexpr bool splits_over_ranks(CollectiveOp op) {
  return op == CollectiveOp::all_gather || op == CollectiveOp::reduce_scatter || op == CollectiveOp::all_to_all ||
         op == CollectiveOp::all_to_all_v;
}
constexpr std::int64_t chunk_count(CollectiveOp op, std::int64_t count, int n) {
  return !splits_over_ranks(op) || n <= 0 ? count : count / n;
}

// Rounds a requested element count down to one every rank can split evenly (as nccl-tests does).
constexpr std::int64_t usable_count(CollectiveOp op, std::int64_t count, int n) {
  return !splits_over_ranks(op) || n <= 0 ? count : (count / n) * n;
}

}  // namespace tedsim
