#pragma once
// A profile measured by `tedsim calibrate`: timings (min/median/max) of GEMMs, memory-bound kernels
// and collectives over TED-shaped groups, with the provenance of the run that measured them.
// Part of the cost model: no kernel, comm or MPI code here, only data and lookups.
//
// File format (measured_profile_file.cpp; the lookups are measured_profile.cpp): JSON, one object,
// written by save_profile, read strictly by load_profile_data (every unknown key is an InputError
// naming the file and the key path, exit code 2):
//   { "format": "tedsim-profile", "version": 1,
//     "provenance": {...}, "calibration": {...optional: arguments, complete},
//     "gemm": [ {"m","n","k","batch","dtype","seconds": {"min","median","max"}} ...],
//     "kernels": [ {"kind","dtype","bytes","seconds": {...}} ...],
//     "collectives": [ {"op","dtype","ranks","nodes","max_ranks_per_node","groups_per_node",
//                       "crosses_islands","bytes","seconds": {...},"busbw_gbs"} ...],
//     "arrival_skew": [ {"ranks","nodes","max_ranks_per_node","compute_s",
//                        "wait_s": {"mean","p90","min","max"},"samples"} ...]   (optional) }
// Doubles are written with shortest round-trip precision, so save -> load is bit-exact.
//
// Lookups (MeasuredProfile):
//  * GEMMs: an exact (m, n, k, batch, dtype) point answers with its median. Otherwise a plane in
//    log time over (log m, log n, log k, log batch), fitted by least squares on the 16 nearest
//    measured shapes (weights 1/distance^2, a small ridge), its answer kept within the FLOP/s
//    range of those neighbours. Queries outside the measured FLOP range (more than 2x beyond)
//    are recorded as extrapolations, with the FLOP/s used.
//  * Kernels: log-log interpolation in bytes between the two neighbouring points of the same kind
//    and dtype; outside the measured range an alpha-beta fit (latency + bytes / bandwidth, least
//    squares in relative error over all points of that kind) answers, recorded as extrapolation.
//    Above the range it is never faster than the largest point (and a flat fit, all points
//    latency-bound, grows linearly from it); below, never slower than the smallest point nor at a
//    higher rate than it. Sizes measured several times count once, with their median time.
//  * Collectives: the same for one (op, group shape). A group shape never measured borrows the
//    nearest measured shape of the same op (same node count first, then closest rank count, then
//    groups per node) and scales its time by bus_bandwidth_factor(op, n) / bus_bandwidth_factor(op,
//    n_measured): i.e. it assumes the bus bandwidth (what a link carries) is what transfers between
//    group sizes of the same placement, which is exactly what busbw was defined for.
//  * Arrival waits (arrival_wait_seconds): for one group shape (ranks, nodes), linear
//    interpolation in the compute segment between the measured points, from no wait after no
//    compute; above the longest segment the wait grows in proportion to the segment. A shape never
//    measured borrows the nearest (same node count first, then closest rank count). A profile
//    without arrival points (older than the measurement) assumes ranks arrive together.
//  * A dtype never measured for a GEMM or kernel uses the other dtypes' points (recorded); an op or
//    kind with no points at all falls back to the analytic profile of the fallback topology.
// Every such departure from a measured point is recorded once per (what, from) and reported by
// warnings(), with the count of lookups, the range of sizes asked and (GEMMs) of the FLOP/s used.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <unordered_map>
#include <vector>

#include "tedsim/profile/analytic_profile.hpp"
#include "tedsim/profile/profile.hpp"
#include "tedsim/spec/expert_shares.hpp"
#include "tedsim/spec/topology_spec.hpp"

namespace tedsim {

struct Timing {
  double min_s = 0, median_s = 0, max_s = 0;
};

// Where and how the numbers were measured.
struct Provenance {
  std::vector<std::string> hosts;    // distinct host names, rank order of first appearance
  std::vector<std::string> devices;  // distinct device names (GPU model or CPU model)
  std::string driver, cuda, cublas, nccl, mpi;  // versions; "" = not applicable
  std::string cpu_model;
  std::string date;             // ISO 8601, UTC
  std::string tedsim_version;
  std::string build_flags;
  std::string backend;          // "cpu" or "cuda"
  int ranks = 1;                // MPI world size of the calibration
  int ranks_per_node = 1;       // most ranks on one host
};

struct GemmPoint {
  GemmShape shape;
  Timing seconds;
};

struct KernelPoint {
  KernelKind kind = KernelKind::gating;
  Dtype dtype = Dtype::fp32;
  double bytes = 0;
  Timing seconds;
};

struct CollectivePoint {
  CollectiveOp op = CollectiveOp::all_reduce;
  Dtype dtype = Dtype::fp32;
  GroupSpan span;
  double bytes = 0;
  Timing seconds;
  double busbw_gbs = 0;
  double busiest_load = 1.0;  // all_to_all_v: the split it was measured with (collective_check.hpp)
};

// Arrival skew in a step-like loop (every rank computes `compute_s`, then the group meets in a
// blocking collective): how long a rank waits there beyond the transfer itself. `wait_mean_s` is
// the mean over ranks and repetitions (what a step's phase timers add up); min/max are over
// repetitions of the rank-mean wait; p90 is over single ranks' waits.
struct SkewPoint {
  GroupSpan span;
  double compute_s = 0;
  double wait_mean_s = 0, wait_p90_s = 0, wait_min_s = 0, wait_max_s = 0;
  int samples = 0;  // repetitions x ranks
};

struct ProfileData {
  Provenance provenance;
  std::vector<GemmPoint> gemms;
  std::vector<KernelPoint> kernels;
  std::vector<CollectivePoint> collectives;
  std::vector<SkewPoint> skews;
  // Dropless MoE models: the experts' shares of the step's routed rows (empty: not measured).
  ExpertShares expert_shares;
  // Calibration bookkeeping (arguments of the run, complete or partial); opaque to lookups.
  // Stored as compact JSON text so this header does not need nlohmann.
  std::string calibration_json;  // "" = none
  bool complete = true;
};

// Text <-> data. `name` is the file name used in error messages.
std::string profile_to_json(const ProfileData& data);
ProfileData profile_from_json(const std::string& text, const std::string& name);
void save_profile(const std::string& path, const ProfileData& data);  // atomic (write + rename)
ProfileData load_profile_data(const std::string& path);               // InputError on bad input

// The same points with every median replaced by the point's fastest (or slowest) repetition: a
// profile at one end of what was measured, for the range a prediction spans over the spread.
enum class SpreadEnd { fastest, slowest };
ProfileData at_spread_end(ProfileData data, SpreadEnd end);

// Stable identities of points (what resume compares and what `profile diff` matches).
std::string point_key(const GemmPoint& p);
std::string point_key(const KernelPoint& p);
std::string point_key(const CollectivePoint& p);
std::string describe_span(const GroupSpan& s);  // "n=4 nodes=2 rpn=2 gpn=1"

KernelKind parse_kernel_kind(const std::string& text);      // throws InputError
CollectiveOp parse_collective_op(const std::string& text);  // throws InputError

class MeasuredProfile final : public Profile {
 public:
  MeasuredProfile(ProfileData data, const TopologySpec& fallback_topology, std::string source = "");
  double gemm_seconds(const GemmShape& shape) const override;
  double kernel_seconds(KernelKind kind, double bytes, Dtype dtype) const override;
  double collective_seconds(CollectiveOp op, const GroupSpan& span, double bytes) const override;
  // Pipeline transfers are not calibrated yet: the fallback topology's analytic model, with a warning.
  double p2p_seconds(const GroupSpan& span, double bytes) const override;
  double arrival_wait_seconds(const GroupSpan& span, double compute_since_sync_s) const override;
  Fp8Quantize fp8_quantize() const override { return fallback_.fp8_quantize(); }
  // Calibration times kernels from C++, not the framework's host path: the topology's figure.
  double host_op_seconds() const override { return fallback_.host_op_seconds(); }
  int device_sms() const override { return fallback_.device_sms(); }
  const ExpertShares* expert_shares() const override { return data_.expert_shares.empty() ? nullptr : &data_.expert_shares; }
  std::string describe() const override;

  const ProfileData& data() const { return data_; }
  // Deduplicated "what was extrapolated and from what", in first-seen order. Lines of lookups
  // far outside the measured sizes (below) begin "far: ".
  std::vector<std::string> warnings() const;

  // Whether the answer to this lookup extrapolates far (more than kFarFactor in size, FLOP for
  // GEMMs) outside the sizes measured for it: the lookups a prediction should not lean on.
  static constexpr double kFarFactor = 4.0;
  bool far_outside(const GemmShape& shape) const;
  bool far_outside(KernelKind kind, double bytes, Dtype dtype) const;
  bool far_outside(CollectiveOp op, const GroupSpan& span, double bytes) const;
  // Whether the answer departs from the measured points at all (any warning: beyond the range, a
  // borrowed group shape or dtype, not measured): what `validate --calibrate` measures.
  bool departs(KernelKind kind, double bytes, Dtype dtype) const;
  bool departs(CollectiveOp op, const GroupSpan& span, double bytes) const;

 private:
  struct Series {  // points of one kernel kind/dtype or one (op, shape), sorted by bytes
    std::vector<double> bytes, seconds;
    double alpha = 0, inv_bw = 0;  // alpha-beta fit
  };
  static void fit(Series& s);
  static std::string fit_text(const Series& s, double scale, const char* bandwidth);
  static double eval(const Series& s, double bytes, int* where);  // where: -1 below, 0 in, 1 above
  enum class SizeUnit { bytes, flop, seconds };
  // Records a departure from a measured point once per key: the size asked (bytes or FLOP) and,
  // with value_unit, a rate the answer used (the warning quotes the range over all lookups).
  void note(const std::string& key, const std::string& text, double size, SizeUnit unit = SizeUnit::bytes,
            double value = 0, const char* value_unit = nullptr) const;

  double gemm_uncached(const GemmShape& shape) const;
  double kernel_uncached(KernelKind kind, double bytes, Dtype dtype) const;
  double collective_uncached(CollectiveOp op, const GroupSpan& span, double bytes) const;

  ProfileData data_;
  AnalyticProfile fallback_;
  std::string source_;
  std::map<std::tuple<int, int>, Series> kernels_;                       // (kind, dtype)
  std::map<std::tuple<int, int, int, int, int, bool>, Series> collectives_;  // (op, ranks, nodes, rpn, gpn, islands)
  std::map<int, std::vector<std::size_t>> gemms_by_dtype_;
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> skews_;  // (ranks, nodes): (compute, wait)
  bool has_send_recv_ = false;  // the pipeline exchange was measured (p2p_seconds)
  bool has_all_to_all_v_ = false;  // dropless's uneven exchange was measured
  bool multi_rank_ = false;  // collectives were measured (so arrival waits could have been)

  struct Warning {
    std::string text;
    bool far = false;  // some lookup was far outside the measured sizes
    long long count = 0;
    double min_size = 0, max_size = 0;  // sizes asked
    SizeUnit unit = SizeUnit::bytes;
    double min_value = 0, max_value = 0;  // a rate the answers used (value_unit empty: none)
    std::string value_unit;
  };
  mutable std::mutex mutex_;
  mutable std::vector<Warning> warnings_;
  mutable std::unordered_map<std::string, std::size_t> warning_index_;
  struct Answer {
    double seconds;
    bool far, departed;
  };
  // Looks `key` up, computing it with `uncached` (mutex_ held) the first time.
  template <class Compute>
  Answer answer(const std::string& key, Compute&& uncached) const;
  Answer gemm_answer(const GemmShape& shape) const;
  Answer kernel_answer(KernelKind kind, double bytes, Dtype dtype) const;
  Answer collective_answer(CollectiveOp op, const GroupSpan& span, double bytes) const;
  mutable bool far_ = false;       // set by the *_uncached computation under way (mutex_ held)
  mutable bool departed_ = false;  // set by note() during it
  mutable std::unordered_map<std::string, Answer> cache_;
};

// For the CLI: a measured profile from `path` (JSON written by tedsim calibrate), falling back to
// the analytic profile of `fallback_topology` for anything never measured.
std::unique_ptr<Profile> load_profile(const std::string& path, const TopologySpec& fallback_topology);

// Prints a MeasuredProfile's warnings (at most `max_lines`, then "... and N more"); nothing for
// other profiles or when there are none.
void print_profile_warnings(std::ostream& out, const Profile& profile, int max_lines = 10);

}  // namespace tedsim
