#pragma once
// The order in which each pipeline stage runs its forward and backward passes, shared by the
// timeline (sim/) and the training step (runtime/) so the two can never disagree; after Megatron-Core's
// pipeline_parallel/schedules.py. A schedule only orders; the timeline (pipeline_timeline.hpp)
// turns the orders and the dependencies between stages into times, so the bubble is what the
// dependencies leave idle, never a formula.
//
// 1F1B (V = 1): stage p runs min(P - p - 1, m) warm-up forwards, then one forward and one backward
// in turn, then the remaining backwards. Interleaved 1F1B (V > 1 chunks per stage): m * V
// chunk-passes; min((P - p - 1) * 2 + (V - 1) * P, m * V) warm-up forwards (Megatron-Core's
// get_pp_rank_microbatches; older releases ran every forward first when m == P); micro-batches
// advance through the chunks in groups of P: forward k runs
// chunk (k mod PV) / P of micro-batch (k / PV) * P + k mod P, backward k the chunks in reverse.
//
// Expert all-to-all overlap (Megatron-Core's combined 1F1B, `merged`): one more warm-up forward,
// so that each steady-state forward and the backward after it are of independent micro-batches
// and run as one merged step (schedules.py at 2edffadb: "to ensure the forward and backward
// computations are independent in all 1f1b steps"; one stage runs forward 0 alone, then forward
// k + 1 with backward k).
#include <vector>

namespace tedsim {

struct PipelineTask {
  int microbatch = 0;
  int chunk = 0;         // model chunk of the stage, 0..V-1 (virtual stage chunk * P + stage)
  bool backward = false;
};

// Warm-up forwards of `stage` under the schedule for P stages, V chunks, m micro-batches.
int warmup_forwards(int stage, int pp, int vpp, int microbatches, bool merged = false);
// The i-th task of `stage` in the order its compute stream runs them (0 <= i < 2 * m * V).
class StageOrder {
 public:
  StageOrder(int stage, int pp, int vpp, int microbatches, bool merged = false);
  int size() const { return 2 * total_; }
  PipelineTask operator[](int i) const;
  // Merged schedules: task i is a steady-state forward that runs as one step with task i + 1 (a backward).
  bool merges_with_next(int i) const {
    const int j = i - warmup_;
    return merged_ && j >= 0 && j < 2 * (total_ - warmup_) && j % 2 == 0;
  }

 private:
  PipelineTask pass(int k, bool backward) const;
  int pp_, vpp_, total_, warmup_;
  bool merged_;
};
// All of them, for tests and memory replays.
std::vector<PipelineTask> stage_order(int stage, int pp, int vpp, int microbatches, bool merged = false);
// Most bytes of activations `stage` keeps at once under `order`: each forward of chunk c keeps
// chunk_bytes[c] until its backward. Replays the whole order.
double peak_in_flight_bytes(const StageOrder& order, const double* chunk_bytes);
// Same for the schedule of `stage`, without the replay: after the warm-up, forward k + w and
// backward k alternate, and which chunks they touch repeats every P * V passes, so the peak is
// reached within the first P * V steady steps. O(P * V). A merged schedule (the expert all-to-all
// overlap) runs each steady forward and backward layer by layer together, the forward's layer i
// beside the backward's layer L-1-i (Megatron-Core's combined 1F1B, model_chunk_schedule_plan.py),
// so a step holds at most `merged_layer_bytes` (the largest layer's) beyond what its backward frees,
// not a whole extra chunk.
double peak_in_flight_bytes(int stage, int pp, int vpp, int microbatches, const double* chunk_bytes, bool merged = false,
                            double merged_layer_bytes = 0);

}  // namespace tedsim
