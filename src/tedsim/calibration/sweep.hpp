#pragma once
// What a calibration measures, derived from the model, topology and cluster it is calibrating
// for: the GEMM shapes and kernel sizes a TED step of that model runs (every configuration search
// would enumerate, built by the same build_workload the cost model uses, so the profile answers
// the questions the cost model will ask), and the collective group shapes those configurations
// create on this world, with a message-size sweep. Deterministic: every rank derives the same list
// in the same order, which is what makes resuming by point count safe.
#include <cstdint>
#include <string>
#include <vector>

#include "tedsim/profile/profile.hpp"
#include "tedsim/spec/model_spec.hpp"
#include "tedsim/spec/rank_layout.hpp"
#include "tedsim/spec/topology_spec.hpp"

namespace tedsim::calibration {

struct SweepOptions {
  int gpus = 1;                 // cluster the GEMM/kernel shapes are derived for
  int world = 1;                // ranks that measure collectives (MPI world size)
  int ranks_per_node = 1;       // as placed by mpirun (most ranks on one host)
  int global_batch = 0;         // 0: 8 sequences per rank of the cluster
  int seq_len = 0;              // 0: the model's
  bool quick = false;
  bool grid = false;            // a generic grid of GEMM shapes and kernel sizes, not the model's
  bool gpu = false;             // timing device: caps sizes to what a CPU core does in seconds
  Dtype dtype = Dtype::fp32;    // measured dtype (CPU: fp32; CUDA: the model's storage dtype)
  // FP8 training (CUDA only): GEMMs keep the dtype the workload asks for, FP8 inside Transformer
  // Engine's linears and `dtype` outside them (output layer, router, attention core).
  bool fp8_gemms = false;
  std::int64_t min_bytes = 0, max_bytes = 0;  // collectives; 0: defaults for quick/full
  double step_factor = 0;                     // 0: default
};

struct GemmCase {
  GemmShape shape;
};

struct KernelCase {
  KernelKind kind = KernelKind::gating;
  double bytes = 0;  // target; the measured point records the bytes actually moved
};

struct CollectiveCaseSpec {
  CollectiveOp op = CollectiveOp::all_reduce;
  GroupKind kind = GroupKind::tensor;
  int t = 1, e = 1, p = 1;      // TED layout (with p pipeline stages) that forms groups of this shape
  RankLayout layout = RankLayout::ted;
  bool expert_tp = true;
  GroupSpan span;               // the widest group of the kind under that layout
  std::int64_t count = 0;       // nccl-tests count of `dtype` elements
  double busiest_load = 1.0;    // all_to_all_v: the busiest rank's share over the mean (collective_check.hpp)
};

// The split dropless routing's all-to-all-v is calibrated with on `ranks` expert ranks: the model's
// imbalance as busiest_rank_load spreads it (1 for a model that is not dropless).
double calibrated_busiest_load(const ModelSpec& model, int ranks);

// One segment length of the arrival-skew loop on the groups of one shape: every rank computes
// about `compute_s` (repetitions of the sentinel GEMM; 0: the fewest a timing runs), then its
// group meets in a blocking collective.
struct SkewCaseSpec {
  GroupKind kind = GroupKind::tensor;
  int t = 1, e = 1, p = 1;
  RankLayout layout = RankLayout::ted;
  bool expert_tp = true;
  GroupSpan span;
  double compute_s = 0;
};

struct Sweep {
  std::vector<GemmCase> gemms;
  std::vector<KernelCase> kernels;
  std::vector<CollectiveCaseSpec> collectives;  // grouped by layout, then op/shape, then size
  std::vector<SkewCaseSpec> skews;              // per group shape (ranks, nodes), short segments first
  std::int64_t min_bytes = 0, max_bytes = 0;
  double step_factor = 0;
  int configs = 0;              // configurations the shapes were collected from
  int gemm_shapes_seen = 0;     // distinct shapes before the cap
  std::size_t points() const { return gemms.size() + kernels.size() + collectives.size() + skews.size(); }
  // Hex digest of every point in order (shapes, sizes, groups): a resumed calibration must measure
  // exactly the points the interrupted one did, even if a model or topology file was edited.
  std::string digest() const;
};

Sweep derive_sweep(const ModelSpec& model, const TopologySpec& topology, const SweepOptions& options);

// Whether the training step runs this collective on this group in place, so calibration times it
// so: the gradient sync and ZeRO's parameter gather on the data groups work in the gradient and
// parameter buffers (Megatron-Core's distributed optimizer and tedsim's step alike), the layers'
// collectives from one buffer into another. MPI's in-place reduce-scatter is about 20% slower
// than its out-of-place one on a 2-rank host (NCCL's two forms run alike).
bool step_runs_in_place(CollectiveOp op, GroupKind group);

// The group shapes a sweep labels its collectives with (and the cost model looks up) assume ranks
// placed in blocks: ranks 0..p-1 on the first host, p..2p-1 on the next, p = the most ranks on one
// host. Throws InputError, naming the first rank out of place and the launch flags that place
// ranks in blocks, when `host_of_rank` (host name per world rank) is placed otherwise.
void require_block_placement(const std::vector<std::string>& host_of_rank);

}  // namespace tedsim::calibration
