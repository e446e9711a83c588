// Pipeline stages: this rank runs its stage's forward and backward passes in the order of
// spec/pipeline_schedule.hpp (1F1B, or interleaved over the stage's chunks), the same order the
// cost model's timeline simulates. Activations and their gradients cross stages as [T, h] per
// micro-batch ([T/t, h] under sequence parallelism): received blocking (the wait is pp_bubble), sent without blocking (copying into the
// message and posting it is pp_p2p) so that two neighbours that each send before they receive
// never wait on each other. Each micro-batch in flight keeps its layer inputs, activations and CAC
// stash (MicroBatchState) from its forward to its backward.
#include "tedsim/runtime/trainer_impl.hpp"

namespace tedsim::runtime {

Trainer::Impl::~Impl() {
  if (outgoing.empty()) return;
  static auto* const unfinished = new std::deque<OutgoingMessage>;
  for (OutgoingMessage& m : outgoing) unfinished->push_back(std::move(m));
}

bool Trainer::Impl::holds_layer(int l) const {
  for (int v = 0; v < pipeline_chunks; ++v) {
    const ModelChunk& c = stage_map.chunk(stage, v);
    if (l >= c.first_layer && l < c.first_layer + c.layers) return true;
  }
  return false;
}

void Trainer::Impl::swap_in_flight(MicroBatchState& s) {
  std::swap(inputs, s.inputs);
  std::swap(acts, s.acts);
  std::swap(stash, s.stash);
  std::swap(tokens, s.tokens);
  std::swap(targets, s.targets);
  std::swap(gbuf, s.gbuf);
  std::swap(aux_sum, s.aux);
}

MicroBatchState& Trainer::Impl::in_flight_state(std::int64_t it, int mb) {
  auto found = in_flight.find(mb);
  if (found != in_flight.end()) return *found->second;
  auto s = std::make_unique<MicroBatchState>();
  s->inputs.resize(L + 1);
  s->acts.resize(cfg.full_recompute() ? 1 : L);
  s->stash.resize(L);
  // Every stage reads the micro-batch's tokens: the first embeds them, the last needs the targets.
  swap_in_flight(*s);
  load_micro_batch(it, mb);
  swap_in_flight(*s);
  return *in_flight.emplace(mb, std::move(s)).first->second;
}

// The layers of `chunk`, forward (recording CAC's stash where a recompute will follow) and backward
// (recomputing each layer first under full recompute); a one-stage step runs the whole model as one.
void Trainer::Impl::chunk_forward(const ModelChunk& chunk, bool backward_follows) {
  const bool ckpt = cfg.full_recompute() && backward_follows;
  for (int l = chunk.first_layer; l < chunk.first_layer + chunk.layers; ++l) {
    LayerActs& A = acts[cfg.full_recompute() ? 0 : l];
    stash[l].clear();
    mode = ckpt && cfg.cac ? CommMode::record : CommMode::live;
    cur_stash = &stash[l];
    gather_unit(l + 1);
    layer_forward(l, inputs[l].data(), A, ensure(inputs[l + 1], static_cast<std::size_t>(Tl) * h));
  }
  mode = CommMode::live;
}

void Trainer::Impl::chunk_backward(const ModelChunk& chunk) {
  const bool ckpt = cfg.full_recompute();
  for (int l = chunk.first_layer + chunk.layers - 1; l >= chunk.first_layer; --l) {
    LayerActs& A = acts[cfg.full_recompute() ? 0 : l];
    gather_unit(l + 1);  // ZeRO-3: for the recompute and the backward
    if (ckpt) {  // recompute this layer's forward from its checkpointed input
      mode = cfg.cac ? CommMode::replay : CommMode::live;
      cur_stash = &stash[l];
      stash_next = 0;
      const std::uint64_t sig = routing_sig;
      layer_forward(l, inputs[l].data(), A, ensure(scratch_out, static_cast<std::size_t>(Tl) * h));
      routing_sig = sig;
      mode = CommMode::live;
      stash[l].clear();
      stash[l].shrink_to_fit();
    }
    layer_backward(l, inputs[l].data(), A, gbuf.data());
    reduce_unit_grads(l + 1);
  }
}

void Trainer::Impl::release_sent() {
  while (!outgoing.empty() && pipe->send_done(outgoing.front().ticket)) outgoing.pop_front();
}

void Trainer::Impl::send_to_stage(int to_stage, const float* data, std::size_t count) {
  const double t0 = clock();
  release_sent();
  outgoing.emplace_back();
  OutgoingMessage& m = outgoing.back();
  float* buf = ensure(m.data, count);
  ops.copy(buf, data, count);
  ops.fence();
  m.ticket = pipe->send(buf, count, Dtype::fp32, to_stage);
  charge(kPpP2p, to_stage > stage ? "p2p_send_activation" : "p2p_send_gradient", t0, now_s());
}

void Trainer::Impl::receive_from_stage(int from_stage, float* data, std::size_t count) {
  const double t0 = clock();
  pipe->recv(data, count, Dtype::fp32, from_stage);
  charge(kPpBubble, "pipeline bubble", t0, now_s());
}

std::array<double, 3> Trainer::Impl::run_pipeline(std::int64_t it, bool backward) {
  std::array<double, 3> sums{0, 0, 0};
  routing_sig = 0;
  const int P = pipeline_stages, virtual_stages = P * pipeline_chunks;
  const std::size_t Th = static_cast<std::size_t>(Tl) * h;  // this rank's rows: T/t under SP
  auto run_forward = [&](int mb, int chunk_index) {
    const int vstage = chunk_index * P + stage;
    const ModelChunk& chunk = stage_map.chunk(stage, chunk_index);
    MicroBatchState& s = in_flight_state(it, mb);
    swap_in_flight(s);
    if (vstage == 0) {
      aux_sum = 0;
      embed_forward();
    } else {
      receive_from_stage((vstage - 1) % P, ensure(inputs[chunk.first_layer], Th), Th);
    }
    chunk_forward(chunk, backward);
    const int end = chunk.first_layer + chunk.layers;
    if (vstage + 1 < virtual_stages) {
      send_to_stage((vstage + 1) % P, inputs[end].data(), Th);
    } else {
      // The loss, and with it the gradient the backward of this chunk starts from (in gbuf).
      const double ce = head_and_loss(backward);
      sums[1] += ce / nmb_global;
    }
    swap_in_flight(s);
    if (!backward && chunk_index == pipeline_chunks - 1) {
      sums[2] += s.aux / nmb_global;  // this stage's MoE layers of the micro-batch
      in_flight.erase(mb);
    }
  };
  auto run_backward = [&](int mb, int chunk_index) {
    const int vstage = chunk_index * P + stage;
    const ModelChunk& chunk = stage_map.chunk(stage, chunk_index);
    MicroBatchState& s = in_flight_state(it, mb);
    swap_in_flight(s);
    if (vstage + 1 < virtual_stages) receive_from_stage((vstage + 1) % P, ensure(gbuf, Th), Th);
    const double aux = aux_sum;  // the recompute adds its layers' aux loss again: not the loss's
    chunk_backward(chunk);
    aux_sum = aux;
    if (vstage == 0) embed_backward();
    else send_to_stage((vstage - 1) % P, gbuf.data(), Th);
    swap_in_flight(s);
    // Chunk 0's backward is the micro-batch's last pass on this stage.
    if (chunk_index == 0) {
      sums[2] += s.aux / nmb_global;
      in_flight.erase(mb);
    }
  };
  if (backward) {
    const StageOrder order(stage, P, pipeline_chunks, ga);
    for (int i = 0; i < order.size(); ++i) {
      const PipelineTask task = order[i];
      if (task.backward) run_backward(task.microbatch, task.chunk);
      else run_forward(task.microbatch, task.chunk);
    }
  } else {
    for (int mb = 0; mb < ga; ++mb)
      for (int v = 0; v < pipeline_chunks; ++v) run_forward(mb, v);
  }
  const double t0 = clock();
  pipe->wait_sends();
  outgoing.clear();
  charge(kPpP2p, "wait for p2p", t0, now_s());
  sums[0] = sums[1] + opt.aux_loss_coef * sums[2];
  return sums;
}

// Tied embeddings on P > 1 stages: the first stage's embedding and the last stage's copy get the
// sum of both gradients, so the two stay equal through identical Adam steps.
void Trainer::Impl::sync_tied_embedding() {
  if (pipeline_stages == 1 || !model.tie_embeddings || tied->size() == 1) return;
  const int id = first_stage() ? emb : lm;
  const double t0 = clock();
  tied->all_reduce(G(id), G(id), store.info(id).numel, Dtype::fp32);
  tied->wait();
  charge(kDpGradSync, "tied_embedding_allreduce", t0, now_s());
}

}  // namespace tedsim::runtime
