#include "tedsim/runtime/layers/mtp.hpp"

namespace tedsim::runtime {

MtpModule::MtpModule(const StepContext& c, int depth)
    : depth_(depth),
      unit_(c.dims.layers + 2 + depth),
      base_(100 * unit_),
      layer_(c, c.dims.layers + 1 + depth, c.dims.layers - 1, "mtp" + std::to_string(depth) + ".layer") {}

void MtpModule::register_params(ParamRegistrar& reg, const StepContext& c, int expert_rank, const InitScales& init) {
  const StepDims& d = c.dims;
  const int h = d.hidden, hl = h / d.tensor_size;
  const std::string p = "mtp" + std::to_string(depth_) + ".";
  reg.set_unit(unit_);
  enorm_.register_params(reg, c.model, p + "enorm", "ln", base_ + 80, h, init.norm_noise);
  hnorm_.register_params(reg, c.model, p + "hnorm", "ln", base_ + 82, h, init.norm_noise);
  eh_proj_ = reg.add(p + "eh_proj", "mtp_eh_proj", base_ + 84, false, false,
                     ParamRegistrar::slice(1, h, 2 * h, 0, 1, d.tensor_rank * hl, (d.tensor_rank + 1) * hl, {{0, 2 * h}}),
                     0, init.stdv);
  final_norm_.register_params(reg, c.model, p + "final_ln", "final_ln", base_ + 86, h, init.norm_noise);
  layer_.register_params(reg, c, expert_rank, init);
  reg.set_unit(unit_);
}

void MtpModule::shift(const StepDims& d, const std::int32_t* tokens, const std::int32_t* targets, MtpActs& A) const {
  const int s = d.seq, ahead = depth_ + 1;
  A.tokens.assign(static_cast<std::size_t>(d.tokens), 0);
  A.targets.assign(static_cast<std::size_t>(d.tokens), 0);
  for (int b = 0; b < d.micro_batch; ++b)
    for (int i = 0; i + ahead < s; ++i) {
      const std::size_t at = static_cast<std::size_t>(b) * s + i;
      A.tokens[at] = tokens[at + ahead];
      A.targets[at] = targets[at + ahead];
    }
}

void MtpModule::forward(StepContext& c, Embedding& embedding, const float* h, MtpActs& A, bool backward_follows) {
  const StepDims& d = c.dims;
  const int T = d.tokens, Tl = d.local_tokens, hd = d.hidden, t = d.tensor_size, hl = hd / t;
  const std::size_t Thl = static_cast<std::size_t>(Tl) * hd;
  const CommMode saved = c.mode;
  c.mode = CommMode::live;  // the entry is never recomputed
  embedding.forward(c, A.tokens.data(), ensure(A.emb, Thl));
  enorm_.forward(c, A.emb.data(), ensure(A.en, Thl), A.enorm);
  hnorm_.forward(c, h, ensure(A.hn, Thl), A.hnorm);
  float* cat = ensure(A.cat, 2 * Thl);
  c.ops.copy_rows(cat, 2 * hd, A.en.data(), hd, hd, Tl);
  c.ops.copy_rows(cat + hd, 2 * hd, A.hn.data(), hd, hd, Tl);
  const float* xin = cat;
  if (d.sequence_parallel) {
    const std::size_t n = 2 * static_cast<std::size_t>(T) * hd;
    c.collective(Coll::all_gather, *c.tp, cat, ensure(A.cat_full, n), n, kTpAllGather, "sp_allgather_mtp");
    xin = A.cat_full.data();
  }
  float* y = ensure(A.proj, static_cast<std::size_t>(T) * hd);
  if (t == 1) {
    c.mm_bt(T, hd, 2 * hd, xin, c.P(eh_proj_), y);
  } else {
    // Each rank's [T, h / t] columns, gathered from the group and laid side by side.
    float* yl = ensure(A.proj_local, static_cast<std::size_t>(T) * hl);
    c.mm_bt(T, hl, 2 * hd, xin, c.P(eh_proj_), yl);
    float* all = ensure(A.proj_gathered, static_cast<std::size_t>(T) * hd);
    c.collective(Coll::all_gather, *c.tp, yl, all, static_cast<std::size_t>(T) * hd, kTpAllGather, "tp_allgather_mtp");
    for (int r = 0; r < t; ++r)
      c.ops.copy_rows(y + static_cast<std::size_t>(r) * hl, hd, all + static_cast<std::size_t>(r) * T * hl, hl, hl, T);
  }
  // Under sequence parallelism this rank's rows go on (scatter_to_sequence_parallel_region).
  const float* mine = d.sequence_parallel ? y + static_cast<std::size_t>(d.tensor_rank) * Thl : y;
  const bool checkpointed = c.cfg.full_recompute() && backward_follows;
  A.stash.clear();
  c.mode = checkpointed && c.cfg.cac ? CommMode::record : CommMode::live;
  c.cur_stash = &A.stash;
  layer_.forward(c, mine, A.layer, ensure(A.layer_out, Thl));
  c.mode = CommMode::live;
  const double t0 = c.clock();
  final_norm_.forward(c, A.layer_out.data(), ensure(A.out, Thl), A.fnorm);
  c.charge(kOther, "final_layernorm", t0, c.clock());
  c.mode = saved;
}

void MtpModule::backward(StepContext& c, Embedding& embedding, const float* h, MtpActs& A, const float* g,
                         float* grad_h) {
  const StepDims& d = c.dims;
  const int T = d.tokens, Tl = d.local_tokens, hd = d.hidden, t = d.tensor_size, hl = hd / t;
  const std::size_t Thl = static_cast<std::size_t>(Tl) * hd;
  Workspace& ws = c.ws;
  const float* y = A.proj.data();
  const float* mine = d.sequence_parallel ? y + static_cast<std::size_t>(d.tensor_rank) * Thl : y;
  // d(loss)/d(layer output), then through the layer (replayed first under full recompute).
  float* gl = ensure(A.grad, Thl);
  const double t0 = c.clock();
  final_norm_.backward(c, A.layer_out.data(), A.fnorm, g, gl);
  c.charge(kOther, "final_layernorm_bwd", t0, c.clock());
  if (c.cfg.full_recompute()) {
    c.mode = c.cfg.cac ? CommMode::replay : CommMode::live;
    c.cur_stash = &A.stash;
    c.stash_next = 0;
    const std::uint64_t sig = c.routing_sig;
    const double aux = c.aux_sum;  // the replay's aux loss is not the loss's
    layer_.forward(c, mine, A.layer, ensure(ws.scratch, Thl));
    c.routing_sig = sig;
    c.aux_sum = aux;
    c.mode = CommMode::live;
  }
  layer_.backward(c, mine, A.layer, gl);
  // eh_proj's output gradient: whole rows (SP: the scatter's backward gathers them), then this
  // rank's columns (the gather's backward).
  const float* gy = gl;
  if (d.sequence_parallel) {
    const std::size_t n = static_cast<std::size_t>(T) * hd;
    c.collective(Coll::all_gather, *c.tp, gl, ensure(A.proj_gathered, n), n, kTpAllGather, "sp_allgather_mtp_bwd");
    gy = A.proj_gathered.data();
  }
  if (t > 1) {
    float* gyl = ensure(A.proj_local, static_cast<std::size_t>(T) * hl);
    c.ops.copy_rows(gyl, hl, gy + static_cast<std::size_t>(d.tensor_rank) * hl, hd, hl, T);
    gy = gyl;
  }
  // The input gradient [T, 2h], summed over the group (SP: reduce-scattered into this rank's
  // rows); the weight gradient from the input rows gathered again under SP, as the layers do.
  const std::size_t n2 = 2 * static_cast<std::size_t>(T) * hd;
  float* gx = ensure(A.cat_full, n2);
  const float* gcat = gx;
  if (d.sequence_parallel) {
    c.mm(T, 2 * hd, hl, gy, c.P(eh_proj_), gx);
    float* xfull = ensure(A.xfull, n2);
    c.collective(Coll::all_gather, *c.tp, A.cat.data(), xfull, n2, kTpAllGather, "sp_regather_for_wgrad");
    c.mm_at_acc(hl, 2 * hd, T, gy, xfull, c.G(eh_proj_));
    c.collective(Coll::reduce_scatter, *c.tp, gx, A.cat.data(), 2 * Thl, kTpAllReduce, "sp_reducescatter_mtp_bwd");
    gcat = A.cat.data();
  } else {
    c.mm_at_acc(hl, 2 * hd, T, gy, A.cat.data(), c.G(eh_proj_));
    c.mm(T, 2 * hd, hl, gy, c.P(eh_proj_), gx);
    if (t > 1) c.tp_allreduce(gx, n2, "tp_allreduce_mtp_bwd");
  }
  // [d en, d hn] apart, through the norms: the embedding's gradient and d(loss)/dh.
  float* gen = ensure(A.en, Thl);
  float* ghn = ensure(A.hn, Thl);
  c.ops.copy_rows(gen, hd, gcat, 2 * hd, hd, Tl);
  c.ops.copy_rows(ghn, hd, gcat + hd, 2 * hd, hd, Tl);
  hnorm_.backward(c, h, A.hnorm, ghn, grad_h);
  float* ge = ensure(ws.hidden_grad2, Thl);
  enorm_.backward(c, A.emb.data(), A.enorm, gen, ge);
  embedding.backward(c, A.tokens.data(), ge);
}

}  // namespace tedsim::runtime
