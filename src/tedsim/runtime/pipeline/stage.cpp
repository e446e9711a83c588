#include "tedsim/runtime/pipeline/stage.hpp"

namespace tedsim::runtime {

Stage::Stage(StepContext& c, ParamSync& sync, const TokenSource& data, int stage, ParamRegistrar& reg,
             int expert_rank, const InitScales& init)
    : c_(c),
      sync_(sync),
      data_(data),
      stage_(stage),
      stages_(c.cfg.pp),
      chunks_(c.cfg.vpp),
      map_(build_stage_map(c.model.layers, c.cfg.pp, c.cfg.vpp, c.cfg.pipeline_layout, c.model.mtp_layers)),
      links_(c) {
  const int L = c.dims.layers;
  if (first()) embedding_.register_params(reg, c, init.stdv);
  // With tied embeddings and P > 1 the last stage holds a copy of the embedding, initialized
  // alike and kept equal (Trainer: the tied-embedding sync).
  if (last()) head_.register_params(reg, c, first() ? embedding_.table() : -1, init.stdv, init.norm_noise);
  if (last() && c.model.mtp_layers > 0) {
    if (first())
      mtp_embedding_.share(embedding_.table());
    else if (c.model.tie_embeddings)
      mtp_embedding_.share(head_.weight());
    else
      mtp_embedding_.register_copy(reg, c, init.stdv);
    for (int k = 0; k < c.model.mtp_layers; ++k) {
      mtp_.push_back(std::make_unique<MtpModule>(c, k));
      mtp_.back()->register_params(reg, c, expert_rank, init);
    }
    mtp_acts_.resize(mtp_.size());
  }
  layers_.resize(L);
  for (int l = 0; l < L; ++l) {
    if (!holds_layer(l)) continue;
    layers_[l] = std::make_unique<TransformerLayer>(c, l);
    layers_[l]->register_params(reg, c, expert_rank, init);
  }
}

bool Stage::holds_layer(int l) const {
  for (int v = 0; v < chunks_; ++v) {
    const ModelChunk& chunk = map_.chunk(stage_, v);
    if (l >= chunk.first_layer && l < chunk.first_layer + chunk.layers) return true;
  }
  return false;
}

void Stage::load(MicroBatch& mb, std::int64_t it, int j) const {
  const StepDims& d = c_.dims;
  mb.tokens.resize(d.tokens);
  mb.targets.resize(d.tokens);
  const std::int64_t group = static_cast<std::int64_t>(j) * d.data_size + d.replica;  // across replicas
  for (int i = 0; i < d.micro_batch; ++i) {
    const std::int64_t g = it * c_.cfg.global_batch + group * d.micro_batch + i;
    const std::size_t at = static_cast<std::size_t>(i) * d.seq;
    data_.sample(g, d.seq, mb.tokens.data() + at, mb.targets.data() + at);
  }
}

void Stage::embed(MicroBatch& mb) {
  sync_.gather_unit(0);
  embedding_.forward(c_, mb.tokens.data(),
                     ensure(mb.inputs[0], static_cast<std::size_t>(c_.dims.local_tokens) * c_.dims.hidden));
}

int Stage::embedding_copy() const {
  if (!last() || first()) return -1;
  if (c_.model.tie_embeddings) return head_.weight();
  return mtp_.empty() ? -1 : mtp_embedding_.table();
}

std::array<double, 2> Stage::head(MicroBatch& mb, bool backward) {
  const StepDims& d = c_.dims;
  sync_.gather_unit(d.layers + 1);
  const float* x = mb.inputs[d.layers].data();
  if (mtp_.empty()) return {head_.forward(c_, x, mb.targets.data(), backward, mb.grad), 0.0};
  // The main loss, then each prediction module's on the previous one's output; each module's
  // loss weighs mtp_loss_scale / D (Megatron-Core's mtp_loss_scaling_factor / mtp_num_layers)
  // over the tokens whose target exists.
  const std::size_t Thl = static_cast<std::size_t>(d.local_tokens) * d.hidden;
  const std::size_t D = mtp_.size();
  const double scale = c_.opt.mtp_loss_scale / double(D);
  const float* normed = head_.norm_forward(c_, x);
  const auto input_of = [&](std::size_t k) { return k == 0 ? normed : mtp_acts_[k - 1].out.data(); };
  float* g_main = backward ? ensure(grad_normed_, Thl) : nullptr;
  const double ce = head_.output_loss(c_, normed, mb.targets.data(), 0, LmHead::token_weight(d), g_main);
  double mtp = 0;
  for (std::size_t k = 0; k < D; ++k) {
    MtpModule& module = *mtp_[k];
    MtpActs& A = mtp_acts_[k];
    sync_.gather_unit(module.unit());
    module.shift(d, mb.tokens.data(), mb.targets.data(), A);
    module.forward(c_, mtp_embedding_, input_of(k), A, backward);
    const int tail = module.masked_tail();
    const float weight = static_cast<float>(scale / (double(d.micro_batch) * (d.seq - tail) * d.global_micro_batches));
    mtp += scale * head_.output_loss(c_, A.out.data(), A.targets.data(), tail, weight,
                                     backward ? ensure(A.grad_out, Thl) : nullptr);
  }
  if (backward) {
    for (std::size_t k = D; k-- > 0;) {
      MtpModule& module = *mtp_[k];
      MtpActs& A = mtp_acts_[k];
      if (k + 1 < D) c_.add_into(Thl, mtp_acts_[k + 1].grad_in.data(), A.grad_out.data());  // the next module's input
      sync_.gather_unit(module.unit());
      module.backward(c_, mtp_embedding_, input_of(k), A, A.grad_out.data(), ensure(A.grad_in, Thl));
      sync_.reduce_unit_grads(module.unit());
    }
    c_.add_into(Thl, mtp_acts_[0].grad_in.data(), g_main);
    head_.norm_backward(c_, x, g_main, mb.grad);
  }
  return {ce, mtp};
}

void Stage::embed_backward(MicroBatch& mb) { embedding_.backward(c_, mb.tokens.data(), mb.grad.data()); }

void Stage::chunk_forward(const ModelChunk& chunk, MicroBatch& mb, bool backward_follows) {
  const bool checkpointed = c_.cfg.full_recompute() && backward_follows;
  const std::size_t Thl = static_cast<std::size_t>(c_.dims.local_tokens) * c_.dims.hidden;
  for (int l = chunk.first_layer; l < chunk.first_layer + chunk.layers; ++l) {
    mb.stash[l].clear();
    c_.mode = checkpointed && c_.cfg.cac ? CommMode::record : CommMode::live;
    c_.cur_stash = &mb.stash[l];
    sync_.gather_unit(l + 1);
    layers_[l]->forward(c_, mb.inputs[l].data(), mb.acts_of(l), ensure(mb.inputs[l + 1], Thl));
  }
  c_.mode = CommMode::live;
}

void Stage::chunk_backward(const ModelChunk& chunk, MicroBatch& mb) {
  const bool checkpointed = c_.cfg.full_recompute();
  const std::size_t Thl = static_cast<std::size_t>(c_.dims.local_tokens) * c_.dims.hidden;
  for (int l = chunk.first_layer + chunk.layers - 1; l >= chunk.first_layer; --l) {
    LayerActs& A = mb.acts_of(l);
    sync_.gather_unit(l + 1);  // ZeRO-3: for the recompute and the backward
    if (checkpointed) {        // recompute this layer's forward from its checkpointed input
      c_.mode = c_.cfg.cac ? CommMode::replay : CommMode::live;
      c_.cur_stash = &mb.stash[l];
      c_.stash_next = 0;
      const std::uint64_t sig = c_.routing_sig;
      layers_[l]->forward(c_, mb.inputs[l].data(), A, ensure(c_.ws.scratch, Thl));
      c_.routing_sig = sig;
      c_.mode = CommMode::live;
      mb.stash[l].clear();
      mb.stash[l].shrink_to_fit();
    }
    layers_[l]->backward(c_, mb.inputs[l].data(), A, mb.grad.data());
    sync_.reduce_unit_grads(l + 1);
  }
}

std::array<double, 3> Stage::run(std::int64_t it, bool backward) {
  return stages_ > 1 ? run_pipeline(it, backward) : run_one_stage(it, backward);
}

std::array<double, 3> Stage::run_one_stage(std::int64_t it, bool backward) {
  const StepDims& d = c_.dims;
  std::array<double, 3> sums{0, 0, 0};
  c_.routing_sig = 0;
  if (!current_) current_ = std::make_unique<MicroBatch>(d.layers, c_.cfg.full_recompute());
  MicroBatch& mb = *current_;
  const ModelChunk whole{0, d.layers, true, true};
  for (int j = 0; j < d.grad_accum; ++j) {
    load(mb, it, j);
    c_.aux_sum = 0;
    embed(mb);
    chunk_forward(whole, mb, backward);
    const auto [ce, mtp] = head(mb, backward);
    const double aux = c_.aux_sum;  // the recompute adds its layers' aux loss again: not the loss's
    if (backward) {
      chunk_backward(whole, mb);
      embed_backward(mb);
    }
    sums[0] += (ce + c_.opt.aux_loss_coef * aux + mtp) / d.global_micro_batches;
    sums[1] += ce / d.global_micro_batches;
    sums[2] += aux / d.global_micro_batches;
  }
  return sums;
}

}  // namespace tedsim::runtime
