#pragma once
// Parameters of the training step, sliced out of one global model.
//
// Every parameter is a slice of a global tensor of shape [A, R, Ccols] (A = experts for expert
// weights, else 1). Values come from a counter-based generator keyed by (seed, tensor id, global
// element index), so every parallel configuration initializes exactly the same global model and
// only ever materializes its own slice. The same mapping gives checksums over the global model:
// each global element is counted once, by its "primary" replica.
//
// Local parameters live in two flat buffers: non-expert (synchronized over the data group) and
// expert (synchronized over the expert-data group); each is padded to a multiple of its group size
// so ZeRO-1 can reduce-scatter it evenly. For ZeRO-3 the parameters are laid out by shard unit (the
// embedding, each layer, the head) and every unit's range is padded alike, so that one unit can be
// all-gathered, or its gradient reduce-scattered, on its own.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tedsim/runtime/tensor.hpp"

namespace tedsim::runtime {

struct Slice {
  int A = 1, R = 1, C = 1;          // global shape
  int a0 = 0, a1 = 1, r0 = 0, r1 = 1;
  std::vector<std::pair<int, int>> cols;  // column ranges [c0, c1), concatenated locally
  std::size_t local_numel() const;
  int local_cols() const;
  // Global flat index of local flat index i.
  std::int64_t global_index(std::size_t i) const;
};

struct ParamInfo {
  std::string name;   // e.g. "layer1.attn.qkv"
  std::string kind;   // embedding, lm_head, ln, attn_qkv, attn_out, mlp_fc1, mlp_fc2, gate, expert_fc1, expert_fc2, final_ln
  int tensor_id = 0;
  bool expert = false;
  bool primary = true;  // this rank counts the slice in global checksums
  bool tp_replicated = false;  // every tensor rank holds it whole (norms, the router)
  // Replicated, but each tensor rank's gradient covers only its own heads (MLA's down projections
  // and latent norms): summed over the tensor group every step, with or without SP.
  bool tp_partial_grad = false;
  int unit = 0;                // its ZeRO-3 shard unit
  Slice slice;
  float mean = 0.0f;  // value = mean + uniform noise of standard deviation std
  float std = 0.02f;
  std::size_t offset = 0;  // into the flat buffer of its group
  std::size_t numel = 0;
};

// Value of global element `index` of tensor `tensor_id` (uniform with the given std, mean 0).
float init_value(std::uint64_t seed, int tensor_id, std::int64_t index, float std);
std::uint64_t mix64(std::uint64_t x);

class ParamStore {
 public:
  // Returns the index of the new parameter; offsets are assigned by finalize().
  int add(ParamInfo info);
  // Lays out the flat buffers (padding each to a multiple of its group size; with `by_unit`, each
  // unit's range) in the current memory space and initializes them through `memory` (the same space).
  void finalize(std::uint64_t seed, int nonexpert_group, int expert_group, MemorySpace& memory, bool by_unit = false);

  // With by_unit: unit u's range in buffer `expert` (0 or 1), padded to a multiple of the group.
  struct UnitRange {
    std::size_t offset[2] = {0, 0}, size[2] = {0, 0};
  };
  const std::vector<UnitRange>& units() const { return units_; }

  std::vector<ParamInfo>& infos() { return infos_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  float* param(int id) { return (infos_[id].expert ? expert_ : nonexpert_).data() + infos_[id].offset; }
  float* grad(int id) { return (infos_[id].expert ? expert_grad_ : nonexpert_grad_).data() + infos_[id].offset; }
  const ParamInfo& info(int id) const { return infos_[id]; }

  Tensor& params(bool expert) { return expert ? expert_ : nonexpert_; }
  Tensor& grads(bool expert) { return expert ? expert_grad_ : nonexpert_grad_; }
  void zero_grads();

 private:
  std::vector<ParamInfo> infos_;
  std::vector<UnitRange> units_;
  Tensor nonexpert_, expert_, nonexpert_grad_, expert_grad_;
};

}  // namespace tedsim::runtime
