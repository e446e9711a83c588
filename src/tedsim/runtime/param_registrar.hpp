#pragma once
// How a module adds its parameters to the store: each a slice of a global tensor (params.hpp),
// tagged with the ZeRO-3 shard unit it belongs to and whether this rank counts it in checksums.
#include <string>
#include <utility>
#include <vector>

#include "tedsim/runtime/params.hpp"

namespace tedsim::runtime {

class ParamRegistrar {
 public:
  ParamRegistrar(ParamStore& store, int data_rank, int expert_data_rank, int tensor_rank)
      : store_(store), data_rank_(data_rank), expert_data_rank_(expert_data_rank), tensor_rank_(tensor_rank) {}

  // The shard unit the next parameters belong to: 0 the embedding, 1 + l layer l, L + 1 the head.
  void set_unit(int unit) { unit_ = unit; }
  // Whether the next replicated parameters get partial gradients on each tensor rank (ParamInfo).
  void set_tp_partial_grads(bool partial) { tp_partial_ = partial; }

  // A parameter: `tensor_id` names its global tensor; `expert` puts it in the expert buffer;
  // `tp_replicated` when every tensor rank holds it whole; `copy` for a copy of a parameter another
  // stage owns (counted there). Values: mean + uniform noise of standard deviation `stdv`.
  int add(const std::string& name, const std::string& kind, int tensor_id, bool expert, bool tp_replicated, Slice sl,
          float mean, float stdv, bool copy = false);
  // A [1, 1, width] vector every tensor rank holds whole (norm gains and biases).
  int add_vector(const std::string& name, const std::string& kind, int tensor_id, int width, float mean, float stdv);

  // Rows [r0, r1) and the listed column ranges of experts [a0, a1) of a global [A, R, C] tensor.
  static Slice slice(int A, int R, int C, int a0, int a1, int r0, int r1, std::vector<std::pair<int, int>> cols);

 private:
  ParamStore& store_;
  int data_rank_, expert_data_rank_, tensor_rank_;
  int unit_ = 0;
  bool tp_partial_ = false;
};

}  // namespace tedsim::runtime
