// A pipeline stage's passes in the order of spec/pipeline_schedule.hpp (1F1B, or interleaved over
// the stage's chunks): the same order the cost model's timeline simulates. Activations and their
// gradients cross stages as [T, h] per micro-batch ([T/t, h] under sequence parallelism) through
// the stage's links; each micro-batch in flight keeps its layer inputs, activations and CAC stash
// from its forward to its backward.
#include "tedsim/runtime/pipeline/stage.hpp"
#include "tedsim/spec/pipeline_schedule.hpp"

namespace tedsim::runtime {

MicroBatch& Stage::in_flight(std::int64_t it, int mb) {
  auto found = in_flight_.find(mb);
  if (found != in_flight_.end()) return *found->second;
  auto state = std::make_unique<MicroBatch>(c_.dims.layers, c_.cfg.full_recompute());
  load(*state, it, mb);  // every stage reads the tokens: the first embeds them, the last needs the targets
  return *in_flight_.emplace(mb, std::move(state)).first->second;
}

std::array<double, 3> Stage::run_pipeline(std::int64_t it, bool backward) {
  const StepDims& d = c_.dims;
  std::array<double, 3> sums{0, 0, 0};
  double mtp_sum = 0;  // multi-token prediction's weighted loss (last stage)
  c_.routing_sig = 0;
  const int P = stages_, virtual_stages = P * chunks_;
  const std::size_t Th = static_cast<std::size_t>(d.local_tokens) * d.hidden;  // this rank's rows
  auto run_forward = [&](int m, int chunk_index) {
    const int vstage = chunk_index * P + stage_;
    const ModelChunk& chunk = map_.chunk(stage_, chunk_index);
    MicroBatch& mb = in_flight(it, m);
    c_.aux_sum = mb.aux;
    if (vstage == 0) {
      c_.aux_sum = 0;
      embed(mb);
    } else {
      links_.receive((vstage - 1) % P, ensure(mb.inputs[chunk.first_layer], Th), Th);
    }
    chunk_forward(chunk, mb, backward);
    const int end = chunk.first_layer + chunk.layers;
    if (vstage + 1 < virtual_stages) {
      links_.send((vstage + 1) % P, mb.inputs[end].data(), Th, true);
    } else {
      // The loss, and with it the gradient the backward of this chunk starts from.
      const auto [ce, mtp] = head(mb, backward);
      sums[1] += ce / d.global_micro_batches;
      mtp_sum += mtp / d.global_micro_batches;
    }
    mb.aux = c_.aux_sum;
    if (!backward && chunk_index == chunks_ - 1) {
      sums[2] += mb.aux / d.global_micro_batches;  // this stage's MoE layers of the micro-batch
      in_flight_.erase(m);
    }
  };
  auto run_backward = [&](int m, int chunk_index) {
    const int vstage = chunk_index * P + stage_;
    const ModelChunk& chunk = map_.chunk(stage_, chunk_index);
    MicroBatch& mb = in_flight(it, m);
    if (vstage + 1 < virtual_stages) links_.receive((vstage + 1) % P, ensure(mb.grad, Th), Th);
    const double aux = c_.aux_sum;  // the recompute adds its layers' aux loss again: not the loss's
    chunk_backward(chunk, mb);
    c_.aux_sum = aux;
    if (vstage == 0)
      embed_backward(mb);
    else
      links_.send((vstage - 1) % P, mb.grad.data(), Th, false);
    // Chunk 0's backward is the micro-batch's last pass on this stage.
    if (chunk_index == 0) {
      sums[2] += mb.aux / d.global_micro_batches;
      in_flight_.erase(m);
    }
  };
  if (backward) {
    const StageOrder order(stage_, P, chunks_, d.grad_accum);
    for (int i = 0; i < order.size(); ++i) {
      const PipelineTask task = order[i];
      if (task.backward)
        run_backward(task.microbatch, task.chunk);
      else
        run_forward(task.microbatch, task.chunk);
    }
  } else {
    for (int m = 0; m < d.grad_accum; ++m)
      for (int v = 0; v < chunks_; ++v) run_forward(m, v);
  }
  links_.finish();
  sums[0] = sums[1] + c_.opt.aux_loss_coef * sums[2] + mtp_sum;
  return sums;
}

}  // namespace tedsim::runtime
