// The Trainer: builds the TED groups and this rank's slice of the global model, runs micro-batches
// (forward, recompute, backward) and the step; the parts are in trainer_layers.cpp,
// trainer_head.cpp and trainer_sync.cpp.
#include "tedsim/runtime/kernel_census.hpp"
#include "tedsim/runtime/trainer_impl.hpp"
#include "tedsim/kernels/cpu/router_of_model.hpp"

namespace tedsim::runtime {

const char* phase_key(int phase) {
  static const char* const keys[kPhaseCount] = {"compute",      "tp_allreduce", "tp_allgather",
                                                "ep_alltoall",  "dp_grad_sync", "optimizer",
                                                "other",        "pp_bubble",    "pp_p2p"};
  return phase >= 0 && phase < kPhaseCount ? keys[phase] : "?";
}

const std::vector<std::string>& step_slice_names() {
  // The names the prediction's trace gives the same operations (sim/ and model/ name them).
  static const std::vector<std::string> names = {
      "compute",  // the time between timed regions (the layers' own kernels)
      "tp_allreduce_attn", "tp_allreduce_mlp", "tp_allreduce_expert", "tp_allreduce_embedding",
      "tp_allreduce_loss_max", "tp_allreduce_loss_sum", "tp_allreduce_lm_head_bwd", "tp_allreduce_shared",
      // Sequence parallelism's collectives (the backward's are the forward's swapped, "_bwd").
      "sp_allgather_attn", "sp_reducescatter_attn", "sp_allgather_mlp", "sp_reducescatter_mlp",
      "sp_allgather_shared", "sp_reducescatter_shared", "sp_allgather_expert", "sp_reducescatter_expert",
      "sp_allgather_attn_bwd", "sp_reducescatter_attn_bwd", "sp_allgather_mlp_bwd", "sp_reducescatter_mlp_bwd",
      "sp_allgather_shared_bwd", "sp_reducescatter_shared_bwd", "sp_allgather_expert_bwd",
      "sp_reducescatter_expert_bwd", "sp_reducescatter_embedding", "sp_allgather_embedding_bwd",
      "sp_allgather_lm_head", "sp_reducescatter_lm_head_bwd", "sp_regather_for_wgrad", "sp_allreduce_router_stats",
      "sp_allreduce_replicated_grads",
      "zero3_param_allgather", "zero3_grad_reducescatter",
      "ep_alltoall_dispatch", "ep_alltoall_combine", "dtd_allgather_dispatch", "dtd_allgather_combine",
      "embedding_lookup", "final_layernorm", "cross_entropy", "cross_entropy_bwd", "final_layernorm_bwd", "embedding_bwd",
      "grad_sync_nonexpert", "grad_sync_expert", "zero_param_allgather", "tied_embedding_allreduce", "adam_step",
      "p2p_send_activation", "p2p_send_gradient", "pipeline bubble", "wait for p2p"};
  return names;
}

void require_step_backend(Backend backend) { require_step_ops(backend); }

Trainer::Impl::Impl(Communicator& w, const ModelSpec& m, const ParallelConfig& c, const TrainerOptions& o)
    : ops_holder(o.census ? with_census(make_step_ops(w.backend()), *o.census) : make_step_ops(w.backend())),
      ops(*ops_holder),
      memory_scope(ops.memory()),
      world(w),
      model(m),
      cfg(c),
      opt(o),
      layout(w.size(), c.tp, c.ep, c.layout, c.expert_tp, c.pp),
      data(o.data_file.empty() ? TokenSource(m.vocab, o.seed, o.data_noise)
                               : TokenSource::from_file(o.data_file, m.vocab, c.seq_len > 0 ? c.seq_len : m.seq_len)) {
  if (cfg.gpus != world.size())
  throw InputError("training step: configuration is for " + std::to_string(cfg.gpus) + " ranks but MPI runs " +
                   std::to_string(world.size()));
  validate_config(cfg, model);
  groups = std::make_unique<TedGroups>(world, layout);
  pipeline_stages = cfg.pp;
  pipeline_chunks = cfg.vpp;
  stage = world.rank() / layout.stage_world();
  stage_map = build_stage_map(model.layers, cfg.pp, cfg.vpp, cfg.pipeline_layout);
  pipe = &groups->pipeline();
  if (pipeline_stages > 1) pipe->prepare_point_to_point();
  {
    // A split is collective over the world: every rank makes it, the same way.
    const int inner = world.rank() % layout.stage_world();
    const int last = inner + (pipeline_stages - 1) * layout.stage_world();
    const bool end = first_stage() || last_stage();
    tied = world.split(end && pipeline_stages > 1 ? std::vector<int>{inner, last} : std::vector<int>{world.rank()},
                       "tied embedding");
  }
  tp = &groups->tensor();
  ep = &groups->expert();
  dp = &groups->data();
  edp = &groups->expert_data();
  setup_dims();
  register_params();
  store.finalize(opt.seed, dp->size(), edp->size(), ops.memory(), cfg.zero >= 3);
  setup_zero3();
  const std::size_t ne_shard = cfg.zero == 0 ? store.params(false).size() : store.params(false).size() / dp->size();
  const std::size_t ex_shard = cfg.zero == 0 ? store.params(true).size() : store.params(true).size() / edp->size();
  zeros(m_ne, ne_shard);
  zeros(v_ne, ne_shard);
  zeros(m_ex, ex_shard);
  zeros(v_ex, ex_shard);
  inputs.resize(L + 1);
  acts.resize(cfg.full_recompute() ? 1 : L);
  stash.resize(L);
}

void Trainer::Impl::setup_dims() {
  L = model.layers;
  t = cfg.tp;
  ti = tp->rank();
  e = model.is_moe() ? cfg.ep : 1;
  b = cfg.micro_batch;
  s = cfg.seq_len > 0 ? cfg.seq_len : model.seq_len;
  T = b * s;
  sp = cfg.sequence_parallel && t > 1;
  if (sp && T % t != 0)
    throw InputError("sequence parallelism splits the micro-batch's " + std::to_string(T) + " tokens over tp " +
                     std::to_string(t) + ", which does not divide them");
  Tl = sp ? T / t : T;
  Tr = Tl;
  h = model.hidden;
  hd = model.head_dim();
  a_l = model.heads / t;
  kv_l = model.kv_heads / t;
  q_l = a_l * hd;
  kvd_l = kv_l * hd;
  qkv_l = q_l + 2 * kvd_l;
  swiglu = model.activation == Activation::swiglu;
  F = model.ffn;
  F_l = F / t;
  F1_l = swiglu ? 2 * F_l : F_l;
  Fx = model.is_moe() ? model.expert_ffn() : F;
  Fe = cfg.expert_tp ? Fx / t : Fx;
  F1e = swiglu ? 2 * Fe : Fe;
  Fs = model.is_moe() ? model.shared_width() : 0;
  Fs_l = Fs / t;
  F1s_l = swiglu ? 2 * Fs_l : Fs_l;
  V = model.vocab;
  V_l = V / t;
  v0 = ti * V_l;
  if (model.hidden_dropout > 0 || model.attention_dropout > 0)
    throw InputError("training step: model " + model.name + " trains with dropout (hidden_dropout " +
                     std::to_string(model.hidden_dropout) + ", attention_dropout " + std::to_string(model.attention_dropout) +
                     "), which this step does not run yet: validate a copy with both set to 0");
  if (model.is_moe()) {
    E = model.moe.experts;
    El = E / e;
    k = model.moe.top_k;
    // SP leaves each tensor rank its own tokens: no DTD slicing of the dispatch.
    split = t > 1 && !sp && (cfg.dtd || !cfg.expert_tp);
    etp_split = split && cfg.expert_tp;
    sp_expert_gather = sp && cfg.expert_tp;
    dropless = model.moe.dropless();
    const MoeSpec& me = model.moe;
    generic_router = !me.deepspeed_gating();
    router_cfg = kernels::router_config(me);
    if (dropless && split)
      throw InputError("dropless routing runs with expert tensor parallelism and without DTD (or t = 1) yet; got " +
                       cfg.describe());
    if (dropless && sp_expert_gather)
      throw InputError("dropless routing with sequence parallelism runs without expert tensor parallelism yet "
                       "(--no-expert-tp: the gather of uneven token counts over the tensor group is not built); got " +
                       cfg.describe());
    if (dropless) {
      C = Cp = 0;  // set per micro-batch by the routing
    } else {
      const int c0 = kernels::capacity(Tr, E, k, me.capacity_factor, me.min_capacity);
      C = sp ? c0 : (c0 + t - 1) / t * t;
      Cp = split ? C / t : C;
      router_cfg.min_capacity = std::max(router_cfg.min_capacity, C);  // the rounded capacity, as the fused gating's
    }
  }
  d = dp->size();
  replica = dp->rank();
  ga = cfg.grad_accum();
  nmb_global = cfg.global_batch / b;
}

int Trainer::Impl::add_param(const std::string& name, const std::string& kind, int id, bool expert, bool tp_replicated, Slice sl,
                float mean, float stdv, bool copy) {
  ParamInfo p;
  p.name = name;
  p.kind = kind;
  p.tensor_id = id;
  p.expert = expert;
  p.tp_replicated = tp_replicated;
  p.unit = registering_unit;
  if (expert)
    p.primary = edp->rank() == 0;
  else
    p.primary = dp->rank() == 0 && (!tp_replicated || tp->rank() == 0);
  if (copy) p.primary = false;  // a copy of a parameter another stage owns: counted there
  p.slice = std::move(sl);
  p.mean = mean;
  p.std = stdv;
  return store.add(std::move(p));
}

Slice Trainer::Impl::make_slice(int A, int R, int Cc, int a0, int a1, int r0, int r1, std::vector<std::pair<int, int>> cols) {
  Slice s;
  s.A = A;
  s.R = R;
  s.C = Cc;
  s.a0 = a0;
  s.a1 = a1;
  s.r0 = r0;
  s.r1 = r1;
  s.cols = std::move(cols);
  return s;
}

void Trainer::Impl::register_params() {
  const float sd = opt.init_std;
  const float sd_out = sd / std::sqrt(2.0f * L);
  const float sd_gate = opt.gate_init_std > 0 ? opt.gate_init_std : sd;
  const float lnn = opt.ln_init_noise;
  // The first stage holds the embedding, the last the final norm and the LM head (with tied
  // embeddings and P > 1, a copy of the embedding, initialized alike and kept equal).
  const Slice vocab_rows = make_slice(1, V, h, 0, 1, v0, v0 + V_l, {{0, h}});
  registering_unit = 0;
  if (first_stage()) emb = add_param("embedding", "embedding", 1, false, false, vocab_rows, 0, sd);
  registering_unit = L + 1;
  if (last_stage()) {
    if (!model.tie_embeddings) lm = add_param("lm_head", "lm_head", 2, false, false, vocab_rows, 0, sd);
    else if (first_stage()) lm = emb;
    else lm = add_param("embedding.copy", "embedding", 1, false, false, vocab_rows, 0, sd, true);
    lnf_g = add_param("final_ln.gamma", "final_ln", 3, false, true, make_slice(1, 1, h, 0, 1, 0, 1, {{0, h}}), 1, lnn);
    if (model.norm == Norm::layernorm)
      lnf_b = add_param("final_ln.beta", "final_ln", 4, false, true, make_slice(1, 1, h, 0, 1, 0, 1, {{0, h}}), 0, lnn);
  }
  const int kvd = model.kv_dim();
  const int qd = model.q_dim();  // heads x head_dim: h unless head_dim is given apart from hidden / heads
  ids.resize(L);
  for (int l = 0; l < L; ++l) {
    if (!holds_layer(l)) continue;
    LayerIds& li = ids[l];
    registering_unit = l + 1;
    const int base = 100 * (l + 1);
    const std::string p = "layer" + std::to_string(l) + ".";
    li.moe = model.is_moe_layer(l);
    li.ln1_g = add_param(p + "ln1.gamma", "ln", base + 0, false, true, make_slice(1, 1, h, 0, 1, 0, 1, {{0, h}}), 1, lnn);
    const bool beta = model.norm == Norm::layernorm;  // RMSNorm has a gain only
    if (beta) li.ln1_b = add_param(p + "ln1.beta", "ln", base + 1, false, true, make_slice(1, 1, h, 0, 1, 0, 1, {{0, h}}), 0, lnn);
    li.qkv = add_param(p + "attn.qkv", "attn_qkv", base + 2, false, false,
                       make_slice(1, h, qd + 2 * kvd, 0, 1, 0, h,
                                  {{ti * q_l, (ti + 1) * q_l},
                                   {qd + ti * kvd_l, qd + (ti + 1) * kvd_l},
                                   {qd + kvd + ti * kvd_l, qd + kvd + (ti + 1) * kvd_l}}),
                       0, sd);
    li.out = add_param(p + "attn.out", "attn_out", base + 3, false, false,
                       make_slice(1, qd, h, 0, 1, ti * q_l, (ti + 1) * q_l, {{0, h}}), 0, sd_out);
    li.ln2_g = add_param(p + "ln2.gamma", "ln", base + 4, false, true, make_slice(1, 1, h, 0, 1, 0, 1, {{0, h}}), 1, lnn);
    if (beta) li.ln2_b = add_param(p + "ln2.beta", "ln", base + 5, false, true, make_slice(1, 1, h, 0, 1, 0, 1, {{0, h}}), 0, lnn);
    const int F1 = swiglu ? 2 * F : F;
    // Columns of this rank's part of an fc1 of `total` width (swiglu: its gate and up halves).
    auto ffn_cols_of = [&](int total, int width, int part) {
      std::vector<std::pair<int, int>> cols{{part * width, (part + 1) * width}};
      if (swiglu) cols.push_back({total + part * width, total + (part + 1) * width});
      return cols;
    };
    auto ffn_cols = [&](int width, int part) { return ffn_cols_of(F, width, part); };
    if (!li.moe) {
      li.fc1 = add_param(p + "mlp.fc1", "mlp_fc1", base + 6, false, false,
                         make_slice(1, h, F1, 0, 1, 0, h, ffn_cols(F_l, ti)), 0, sd);
      li.fc2 = add_param(p + "mlp.fc2", "mlp_fc2", base + 7, false, false,
                         make_slice(1, F, h, 0, 1, ti * F_l, (ti + 1) * F_l, {{0, h}}), 0, sd_out);
    } else {
      const int ei = ep->rank();
      const int part = cfg.expert_tp ? ti : 0;
      li.gate = add_param(p + "moe.gate", "gate", base + 8, false, true, make_slice(1, h, E, 0, 1, 0, h, {{0, E}}), 0,
                          sd_gate);
      const int F1x = swiglu ? 2 * Fx : Fx;
      li.efc1 = add_param(p + "moe.experts.fc1", "expert_fc1", base + 9, true, false,
                          make_slice(E, h, F1x, ei * El, (ei + 1) * El, 0, h, ffn_cols_of(Fx, Fe, part)), 0, sd);
      li.efc2 = add_param(p + "moe.experts.fc2", "expert_fc2", base + 10, true, false,
                          make_slice(E, Fx, h, ei * El, (ei + 1) * El, part * Fe, (part + 1) * Fe, {{0, h}}), 0,
                          sd_out);
      if (Fs > 0) {
        const int F1s = swiglu ? 2 * Fs : Fs;
        li.sfc1 = add_param(p + "moe.shared.fc1", "shared_fc1", base + 11, false, false,
                            make_slice(1, h, F1s, 0, 1, 0, h, ffn_cols_of(Fs, Fs_l, ti)), 0, sd);
        li.sfc2 = add_param(p + "moe.shared.fc2", "shared_fc2", base + 12, false, false,
                            make_slice(1, Fs, h, 0, 1, ti * Fs_l, (ti + 1) * Fs_l, {{0, h}}), 0, sd_out);
      }
    }
  }
}

void Trainer::Impl::collective(Coll kind, Communicator& comm, const float* sendbuf, float* recvbuf, std::size_t recv_count, int ph,
                              const char* name) {
  if (mode == CommMode::replay) {
    Tensor& saved = (*cur_stash)[stash_next++];
    ops.copy(recvbuf, saved.data(), recv_count);
    return;
  }
  const int n = comm.size();
  if (n == 1) {  // a group of one moves nothing: its copy counts as compute, as in the cost model
    ops.copy(recvbuf, sendbuf, recv_count);
  } else {
    const double t0 = clock();
    switch (kind) {
      case Coll::all_reduce: comm.all_reduce(sendbuf, recvbuf, recv_count, Dtype::fp32); break;
      case Coll::all_gather: comm.all_gather(sendbuf, recvbuf, recv_count / n, Dtype::fp32); break;
      case Coll::reduce_scatter: comm.reduce_scatter(sendbuf, recvbuf, recv_count, Dtype::fp32); break;
      case Coll::all_to_all: comm.all_to_all(sendbuf, recvbuf, recv_count / n, Dtype::fp32); break;
    }
    comm.wait();
    charge(ph, name, t0, now_s());
  }
  if (mode == CommMode::record) {
    cur_stash->emplace_back();
    ops.copy(ensure(cur_stash->back(), recv_count), recvbuf, recv_count);
  }
}

void Trainer::Impl::all_to_all_v(const float* sendbuf, const std::vector<std::size_t>& send_counts, float* recvbuf,
                                 const std::vector<std::size_t>& recv_counts, const char* name) {
  std::size_t recv_total = 0;
  for (std::size_t c : recv_counts) recv_total += c;
  if (mode == CommMode::replay) {
    Tensor& saved = (*cur_stash)[stash_next++];
    ops.copy(recvbuf, saved.data(), recv_total);
    return;
  }
  if (ep->size() == 1) {
    ops.copy(recvbuf, sendbuf, recv_total);
  } else {
    const double t0 = clock();
    ep->all_to_all_v(sendbuf, send_counts, recvbuf, recv_counts, Dtype::fp32);
    ep->wait();
    charge(kEpAllToAll, name, t0, now_s());
  }
  if (mode == CommMode::record) {
    cur_stash->emplace_back();
    ops.copy(ensure(cur_stash->back(), std::max<std::size_t>(recv_total, 1)), recvbuf, recv_total);
  }
}

void Trainer::Impl::load_micro_batch(std::int64_t it, int j) {
  tokens.resize(T);
  targets.resize(T);
  const std::int64_t group = static_cast<std::int64_t>(j) * d + replica;  // micro-batch group across replicas
  for (int i = 0; i < b; ++i) {
    const std::int64_t g = it * cfg.global_batch + group * b + i;
    data.sample(g, s, tokens.data() + static_cast<std::size_t>(i) * s, targets.data() + static_cast<std::size_t>(i) * s);
  }
}

double Trainer::Impl::micro_batch(bool backward, double* ce_out, double* aux_out) {
  aux_sum = 0;
  embed_forward();
  const ModelChunk whole{0, L, true, true};
  chunk_forward(whole, backward);
  const double aux = aux_sum;
  const double ce = head_and_loss(backward);
  if (backward) {
    chunk_backward(whole);
    embed_backward();
  }
  if (ce_out) *ce_out = ce;
  if (aux_out) *aux_out = aux;
  return ce + opt.aux_loss_coef * aux;
}

std::array<double, 3> Trainer::Impl::run_micro_batches(std::int64_t it, bool backward) {
  const std::array<double, 3> sums = pipeline_stages > 1 ? run_pipeline(it, backward) : run_one_stage(it, backward);
  // The backward's last part under SP (Megatron-Core's finalize_model_grads): the replicated
  // parameters' gradients, each tensor rank's from its own tokens, summed over the group.
  if (backward) sync_sequence_parallel_grads();
  return sums;
}

std::array<double, 3> Trainer::Impl::run_one_stage(std::int64_t it, bool backward) {
  std::array<double, 3> sums{0, 0, 0};
  routing_sig = 0;
  for (int j = 0; j < ga; ++j) {
    load_micro_batch(it, j);
    double ce = 0, aux = 0;
    const double loss = micro_batch(backward, &ce, &aux);
    sums[0] += loss / nmb_global;
    sums[1] += ce / nmb_global;
    sums[2] += aux / nmb_global;
  }
  return sums;
}

// A non-finite loss or gradient stops the step naming where: a NaN table row helps nobody. The
// gradients are read on the host: every step on the CPU backend; on CUDA (a download of every
// gradient) only once the loss is non-finite, so a NaN gradient there is named one step later.
// Local to the rank, so it adds no synchronization to the step: the rank that finds one throws,
// and validate ends every rank (MPI_Abort) rather than leave the others in the next collective.
void Trainer::Impl::check_finite(double loss_share) {
  const bool loss_bad = !std::isfinite(loss_share);
  std::string found;
  if (ops.backend() != Backend::cuda || loss_bad) {
    std::vector<float> host;
    for (std::size_t id = 0; id < store.infos().size() && found.empty(); ++id) {
      const ParamInfo& p = store.info(static_cast<int>(id));
      host.resize(p.numel);
      ops.to_host(store.grad(static_cast<int>(id)), host.data(), p.numel);
      for (std::size_t i = 0; i < p.numel; ++i) {
        if (std::isfinite(host[i])) continue;
        found = "non-finite gradient of " + p.kind + " (" + p.name + ", element " + std::to_string(i) +
                (loss_bad ? "; the loss is non-finite too" : "") + ")";
        break;
      }
    }
    for (int b = 0; b < 2 && found.empty(); ++b) {  // ZeRO-3: the layers' gradients are in the owned shards
      if (!zero3[b]) continue;
      host.resize(grad_shard[b].size());
      ops.to_host(grad_shard[b].data(), host.data(), host.size());
      for (std::size_t i = 0; i < host.size() && found.empty(); ++i)
        if (!std::isfinite(host[i]))
          found = std::string("non-finite gradient in the owned ZeRO-3 shard of the ") + (b ? "expert" : "non-expert") +
                  " parameters (element " + std::to_string(i) + (loss_bad ? "; the loss is non-finite too" : "") + ")";
    }
    if (found.empty() && loss_bad) found = "non-finite loss (" + std::to_string(loss_share) + ") with finite gradients";
  }
  if (found.empty()) return;
  throw RunError(world.where() + ": step " + std::to_string(iter) + ": " + found +
                 ": lower the learning rate (--lr) or check the data");
}

StepStats Trainer::Impl::step() {
  phase.fill(0);
  slices.clear();
  const double t0 = clock();
  step_origin = t0;
  store.zero_grads();
  std::array<double, 3> sums = run_micro_batches(iter, true);
  const double check0 = clock();
  check_finite(sums[0]);
  const double checked = clock() - check0;  // tedsim's own check: not the step's time
  const std::size_t before_check = slices.size();
  sync_tied_embedding();
  sync_and_update();
  const double t1 = clock() - checked;
  // Global loss: sum of the replicas' shares (TP ranks of a replica hold the same numbers), reduced
  // in the backend's memory (NCCL reduces device buffers only).
  float red3[3] = {static_cast<float>(sums[0]), static_cast<float>(sums[1]), static_cast<float>(sums[2])};
  if (d > 1) {
    float* dev = ensure(loss_sums, 3);
    ops.from_host(red3, dev, 3);
    ops.fence();  // NCCL's stream is not ordered after the copy
    dp->all_reduce(dev, dev, 3, Dtype::fp32);
    dp->wait();
    ops.to_host(dev, red3, 3);
  }
  // Stages hold parts of the loss: the last the cross-entropy, each its MoE layers' aux loss.
  if (pipeline_stages > 1) {
    float* dev = ensure(loss_sums, 3);
    ops.from_host(red3, dev, 3);
    ops.fence();
    pipe->all_reduce(dev, dev, 3, Dtype::fp32);
    pipe->wait();
    ops.to_host(dev, red3, 3);
  }
  StepStats st;
  st.loss = red3[0];
  st.ce_loss = red3[1];
  st.aux_loss = red3[2];
  st.seconds = t1 - t0;
  double other = 0;
  for (int p = 1; p < kPhaseCount; ++p) other += phase[p];
  phase[kCompute] = std::max(0.0, st.seconds - other);
  st.phase = phase;
  for (std::size_t i = before_check; i < slices.size(); ++i) {  // the check's time is not the step's
    slices[i].start_s -= checked;
    slices[i].end_s -= checked;
  }
  st.slices = slices;
  ++iter;
  return st;
}


Trainer::Trainer(Communicator& world, const ModelSpec& model, const ParallelConfig& config, const TrainerOptions& options)
    : impl_(std::make_unique<Impl>(world, model, config, options)) {}
Trainer::~Trainer() = default;

StepStats Trainer::step() { return impl_->step(); }

double Trainer::loss_and_grads(std::int64_t iteration) {
  impl_->store.zero_grads();
  return impl_->run_micro_batches(iteration, true)[0];
}

double Trainer::loss_only(std::int64_t iteration) { return impl_->run_micro_batches(iteration, false)[0]; }

std::uint64_t Trainer::routing_signature() const { return impl_->routing_sig; }
const std::vector<double>& Trainer::imbalance_samples() const { return impl_->imbalance_samples; }
std::vector<Checksum> Trainer::checksums() { return impl_->checksums(); }
ParamStore& Trainer::params() { return impl_->store; }
std::vector<float> Trainer::param_to_host(int id) {
  std::vector<float> v(impl_->store.info(id).numel);
  impl_->ops.to_host(impl_->store.param(id), v.data(), v.size());
  return v;
}
std::vector<float> Trainer::grad_to_host(int id) {
  std::vector<float> v(impl_->store.info(id).numel);
  impl_->ops.to_host(impl_->store.grad(id), v.data(), v.size());
  return v;
}
int Trainer::capacity() const { return impl_->C; }
std::int64_t Trainer::iteration() const { return impl_->iter; }

std::string Trainer::describe() const {
  const Impl& m = *impl_;
  std::string text = "data: " + m.data.describe() + "; tokens per micro-batch " + std::to_string(m.T) + ", " +
                     std::to_string(m.ga) + " micro-batches per replica, " + std::to_string(m.d) + " replicas";
  if (m.model.is_moe()) {
    text += "; capacity " + std::to_string(m.C) + (m.split ? " (C/t = " + std::to_string(m.Cp) + " per TP rank)" : "");
  }
  return text;
}

}  // namespace tedsim::runtime
