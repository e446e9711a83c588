#pragma once
// A profile that answers from another and remembers every question: the GEMM shapes, kernel sizes
// and collectives (op, group shape, bytes; the pipeline's p2p as send_recv) a prediction asks
// about, each once, in first-asked order. `validate --calibrate` measures the ones its profile cannot answer from measured points.
#include <algorithm>
#include <set>
#include <tuple>
#include <vector>

#include "tedsim/profile/profile.hpp"

namespace tedsim {

struct KernelLookup {
  KernelKind kind;
  double bytes;
  Dtype dtype;
};

struct SkewLookup {
  GroupSpan span;
  double longest_compute_s;  // the longest compute segment asked about
};

struct CollectiveLookup {
  CollectiveOp op;
  GroupSpan span;
  double bytes;
};

class RecordingProfile final : public Profile {
 public:
  explicit RecordingProfile(const Profile& inner) : inner_(inner) {}
  double gemm_seconds(const GemmShape& s) const override {
    if (seen_.insert(std::make_tuple(s.grouped ? 'G' : 'g', s.m, s.n, s.k, s.batch, int(s.dtype), 0.0)).second) gemms_.push_back(s);
    return inner_.gemm_seconds(s);
  }
  double kernel_seconds(KernelKind kind, double bytes, Dtype dtype) const override {
    if (bytes > 0 && seen_.insert(std::make_tuple('k', std::int64_t(kind), std::int64_t(0), std::int64_t(0),
                                                  std::int64_t(0), int(dtype), bytes))
                         .second)
      kernels_.push_back({kind, bytes, dtype});
    return inner_.kernel_seconds(kind, bytes, dtype);
  }
  double collective_seconds(CollectiveOp op, const GroupSpan& span, double bytes) const override {
    record(op, span, bytes);
    return inner_.collective_seconds(op, span, bytes);
  }
  // The pipeline's exchange is the send_recv collective of the pipeline groups (as calibrated).
  double p2p_seconds(const GroupSpan& span, double bytes) const override {
    record(CollectiveOp::send_recv, span, bytes);
    return inner_.p2p_seconds(span, bytes);
  }
  double arrival_wait_seconds(const GroupSpan& span, double compute_s) const override {
    if (span.ranks > 1) {
      bool found = false;
      for (SkewLookup& s : skews_)
        if (s.span.ranks == span.ranks && s.span.nodes == span.nodes) {
          s.longest_compute_s = std::max(s.longest_compute_s, compute_s);
          found = true;
        }
      if (!found) skews_.push_back({span, compute_s});
    }
    return inner_.arrival_wait_seconds(span, compute_s);
  }
  double attention_seconds(AttentionKernel kernel, bool backward, const AttentionShape& shape) const override {
    return inner_.attention_seconds(kernel, backward, shape);
  }
  std::string describe() const override { return inner_.describe(); }

  const std::vector<GemmShape>& gemms() const { return gemms_; }
  const std::vector<KernelLookup>& kernels() const { return kernels_; }
  const std::vector<CollectiveLookup>& collectives() const { return collectives_; }
  const std::vector<SkewLookup>& skews() const { return skews_; }  // group shapes asked for their arrival wait

 private:
  void record(CollectiveOp op, const GroupSpan& span, double bytes) const {
    if (span.ranks > 1 && bytes > 0 &&
        seen_.insert(std::make_tuple('c', std::int64_t(op), std::int64_t(span.ranks), std::int64_t(span.nodes),
                                     std::int64_t(span.max_ranks_per_node * 2 + (span.crosses_islands ? 1 : 0)),
                                     span.groups_per_node, bytes))
            .second)
      collectives_.push_back({op, span, bytes});
  }
  const Profile& inner_;
  mutable std::set<std::tuple<char, std::int64_t, std::int64_t, std::int64_t, std::int64_t, int, double>> seen_;
  mutable std::vector<GemmShape> gemms_;
  mutable std::vector<KernelLookup> kernels_;
  mutable std::vector<CollectiveLookup> collectives_;
  mutable std::vector<SkewLookup> skews_;
};

}  // namespace tedsim
