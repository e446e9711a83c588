// The Trainer composes the step (DESIGN.md section 8): it builds the TED groups, the shared step
// context, this rank's pipeline stage (whose modules register their slices of the global model),
// and the parameter sync; a step runs the stage's micro-batches, checks the gradients, syncs and
// updates, and reduces the loss.
#include <cmath>

#include "tedsim/comm/ted_groups.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cpu/router_of_model.hpp"
#include "tedsim/runtime/data.hpp"
#include "tedsim/runtime/kernel_census.hpp"
#include "tedsim/runtime/optimizer/param_sync.hpp"
#include "tedsim/runtime/pipeline/stage.hpp"
#include "tedsim/runtime/step_checks.hpp"
#include "tedsim/runtime/step_context.hpp"

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
      // Multi-token prediction's eh_proj (layers/mtp.hpp).
      "sp_allgather_mtp", "tp_allgather_mtp", "sp_allgather_mtp_bwd", "sp_reducescatter_mtp_bwd", "tp_allreduce_mtp_bwd",
      "zero3_param_allgather", "zero3_grad_reducescatter",
      "ep_alltoall_dispatch", "ep_alltoall_combine", "dtd_allgather_dispatch", "dtd_allgather_combine",
      "embedding_lookup", "final_layernorm", "cross_entropy", "cross_entropy_bwd", "final_layernorm_bwd", "embedding_bwd",
      "grad_sync_nonexpert", "grad_sync_expert", "zero_param_allgather", "tied_embedding_allreduce", "adam_step",
      "p2p_send_activation", "p2p_send_gradient", "pipeline bubble", "wait for p2p"};
  return names;
}

void require_step_backend(Backend backend) { require_step_ops(backend); }

struct Trainer::Impl {
  // First members: every Tensor below allocates from ops' memory space, so the ops must be made
  // before and destroyed after all of them.
  std::unique_ptr<StepOps> ops_holder;
  StepOps& ops;
  ScopedMemorySpace memory_scope;
  Communicator& world;
  ModelSpec model;
  ParallelConfig cfg;
  TrainerOptions opt;
  TedLayout layout;
  std::unique_ptr<TedGroups> groups;
  std::unique_ptr<Communicator> tied;  // first and last stage, for a tied embedding's gradient
  ParamStore store;
  TokenSource data;
  StepContext ctx;
  ParamSync sync;
  std::unique_ptr<Stage> stage;
  Tensor loss_sums;  // the step's loss shares, reduced over replicas and stages
  std::int64_t iter = 0;

  Impl(Communicator& w, const ModelSpec& m, const ParallelConfig& c, const TrainerOptions& o);

  std::array<double, 3> run_micro_batches(std::int64_t it, bool backward);
  void check_finite(double loss_share);
  void sync_tied_embedding();
  // The loss shares summed over `comm` in the backend's memory (NCCL reduces device buffers only).
  void reduce_losses(Communicator& comm, float* host3);
  // Collective: this rank's loss shares summed over data replicas and stages (the global loss,
  // CE and aux), as step() reports them.
  std::array<float, 3> global_losses(const std::array<double, 3>& sums);
  StepStats step();
};

namespace {
GemmRounding rounding_of(const TrainerOptions& o) {
  GemmRounding r;
  r.bf16_operands = o.cpu_bf16_gemm_operands;
  r.weight_copies = o.bf16_weight_copies;
  return r;
}
}  // namespace

Trainer::Impl::Impl(Communicator& w, const ModelSpec& m, const ParallelConfig& c, const TrainerOptions& o)
    : ops_holder(o.census ? with_census(make_step_ops(w.backend(), rounding_of(o)), *o.census)
                          : make_step_ops(w.backend(), rounding_of(o))),
      ops(*ops_holder),
      memory_scope(ops.memory()),
      world(w),
      model(m),
      cfg(c),
      opt(o),
      layout(w.size(), c.tp, c.ep, c.layout, c.expert_tp, c.pp),
      data(o.data_file.empty() ? TokenSource(m.vocab, o.seed, o.data_noise)
                               : TokenSource::from_file(o.data_file, m.vocab, c.seq_len > 0 ? c.seq_len : m.seq_len)),
      ctx(ops, w, model, cfg, opt, store),
      sync(ctx) {
  if (cfg.gpus != world.size())
    throw InputError("training step: configuration is for " + std::to_string(cfg.gpus) + " ranks but MPI runs " +
                     std::to_string(world.size()));
  validate_config(cfg, model);
  groups = std::make_unique<TedGroups>(world, layout);
  const int stage_index = world.rank() / layout.stage_world();
  ctx.tp = &groups->tensor();
  ctx.ep = &groups->expert();
  ctx.dp = &groups->data();
  ctx.edp = &groups->expert_data();
  ctx.pipe = &groups->pipeline();
  if (cfg.pp > 1) ctx.pipe->prepare_point_to_point();
  {
    // A split is collective over the world: every rank makes it, the same way.
    const int inner = world.rank() % layout.stage_world();
    const int last = inner + (cfg.pp - 1) * layout.stage_world();
    const bool end = stage_index == 0 || stage_index == cfg.pp - 1;
    tied = world.split(end && cfg.pp > 1 ? std::vector<int>{inner, last} : std::vector<int>{world.rank()},
                       "tied embedding");
  }
  ctx.dims = step_dims(model, cfg, ctx.tp->rank(), ctx.dp->size(), ctx.dp->rank());
  if (model.is_moe()) {
    ctx.router_cfg = kernels::router_config(model.moe);
    // The rounded capacity, as the fused gating's.
    if (!ctx.dims.dropless) ctx.router_cfg.min_capacity = std::max(ctx.router_cfg.min_capacity, ctx.dims.capacity);
  }
  InitScales init;
  init.stdv = opt.init_std;
  init.out_std = opt.init_std / std::sqrt(2.0f * model.layers);
  init.gate_std = opt.gate_init_std > 0 ? opt.gate_init_std : opt.init_std;
  init.norm_noise = opt.ln_init_noise;
  ParamRegistrar registrar(store, ctx.dp->rank(), ctx.edp->rank(), ctx.tp->rank());
  stage = std::make_unique<Stage>(ctx, sync, data, stage_index, registrar, ctx.ep->rank(), init);
  store.finalize(opt.seed, ctx.dp->size(), ctx.edp->size(), ops.memory(), cfg.zero >= 3);
  sync.prepare();
}

std::array<double, 3> Trainer::Impl::run_micro_batches(std::int64_t it, bool backward) {
  // Every write to parameters (the optimizer, ZeRO's gathers, a caller through params()) happens
  // between calls to this, so the weights' bf16 copies are remade at most once per call.
  ops.parameters_changed();
  const std::array<double, 3> sums = stage->run(it, backward);
  // The backward's last part under SP (Megatron-Core's finalize_model_grads): the replicated
  // parameters' gradients, each tensor rank's from its own tokens, summed over the group.
  if (backward) sync.sync_sequence_parallel_grads();
  return sums;
}

// A non-finite loss or gradient stops the step naming where: a NaN table row helps nobody. Local
// to the rank, so it adds no synchronization to the step: the rank that finds one throws, and
// validate ends every rank (MPI_Abort) rather than leave the others in the next collective.
void Trainer::Impl::check_finite(double loss_share) {
  const Tensor* const shards[2] = {sync.owned_grad_shard(0), sync.owned_grad_shard(1)};
  const std::string found = first_non_finite(ops, store, shards, loss_share);
  if (found.empty()) return;
  throw RunError(world.where() + ": step " + std::to_string(iter) + ": " + found +
                 ": lower the learning rate (--lr) or check the data");
}

// Tied embeddings, or multi-token prediction's lookups, on P > 1 stages: the first stage's embedding
// and the last stage's copy get the sum of both gradients, so the two stay equal through identical
// Adam steps (Megatron-Core all-reduces the word embeddings' gradients between the two likewise).
void Trainer::Impl::sync_tied_embedding() {
  if (cfg.pp == 1 || tied->size() == 1) return;
  const int id = stage->first() ? stage->embedding_table() : stage->embedding_copy();
  if (id < 0 || (!model.tie_embeddings && model.mtp_layers == 0)) return;
  const double t0 = ctx.clock();
  tied->all_reduce(ctx.G(id), ctx.G(id), store.info(id).numel, Dtype::fp32);
  tied->wait();
  ctx.charge(kDpGradSync, "tied_embedding_allreduce", t0, now_s());
}

std::array<float, 3> Trainer::Impl::global_losses(const std::array<double, 3>& sums) {
  std::array<float, 3> red3 = {static_cast<float>(sums[0]), static_cast<float>(sums[1]), static_cast<float>(sums[2])};
  if (ctx.dims.data_size > 1) reduce_losses(*ctx.dp, red3.data());
  if (cfg.pp > 1) reduce_losses(*ctx.pipe, red3.data());
  return red3;
}

void Trainer::Impl::reduce_losses(Communicator& comm, float* host3) {
  float* dev = ensure(loss_sums, 3);
  ops.from_host(host3, dev, 3);
  ops.fence();  // NCCL's stream is not ordered after the copy
  comm.all_reduce(dev, dev, 3, Dtype::fp32);
  comm.wait();
  ops.to_host(dev, host3, 3);
}

StepStats Trainer::Impl::step() {
  ctx.phase.fill(0);
  ctx.slices.clear();
  const double t0 = ctx.clock();
  ctx.step_origin = t0;
  store.zero_grads();
  std::array<double, 3> sums = run_micro_batches(iter, true);
  const double check0 = ctx.clock();
  check_finite(sums[0]);
  const double checked = ctx.clock() - check0;  // tedsim's own check: not the step's time
  const std::size_t before_check = ctx.slices.size();
  sync_tied_embedding();
  sync.sync_and_update();
  const double t1 = ctx.clock() - checked;
  // Global loss: the sum of the replicas' shares (TP ranks of a replica hold the same numbers);
  // stages hold parts of it: the last the cross-entropy, each its MoE layers' aux loss.
  const std::array<float, 3> red3 = global_losses(sums);
  StepStats st;
  st.loss = red3[0];
  st.ce_loss = red3[1];
  st.aux_loss = red3[2];
  st.seconds = t1 - t0;
  PhaseSeconds phase = ctx.phase;
  double other = 0;
  for (int p = 1; p < kPhaseCount; ++p) other += phase[p];
  phase[kCompute] = std::max(0.0, st.seconds - other);
  st.phase = phase;
  for (std::size_t i = before_check; i < ctx.slices.size(); ++i) {  // the check's time is not the step's
    ctx.slices[i].start_s -= checked;
    ctx.slices[i].end_s -= checked;
  }
  st.slices = ctx.slices;
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

double Trainer::global_loss(std::int64_t iteration) {
  return impl_->global_losses(impl_->run_micro_batches(iteration, false))[0];
}

std::uint64_t Trainer::routing_signature() const { return impl_->ctx.routing_sig; }
const std::vector<double>& Trainer::imbalance_samples() const { return impl_->ctx.imbalance_samples; }
const std::vector<double>& Trainer::rank_load_samples() const { return impl_->ctx.rank_load_samples; }
const std::vector<std::vector<std::int32_t>>& Trainer::expert_load_samples() const {
  return impl_->ctx.expert_load_samples;
}
std::vector<Checksum> Trainer::checksums() {
  impl_->sync.gather_all_units();  // ZeRO-3: each rank holds only its shards up to date
  return global_checksums(impl_->ops, impl_->store, impl_->world);
}
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
int Trainer::capacity() const { return impl_->ctx.dims.capacity; }
std::int64_t Trainer::iteration() const { return impl_->iter; }

std::string Trainer::describe() const {
  const Impl& m = *impl_;
  const StepDims& d = m.ctx.dims;
  std::string text = "data: " + m.data.describe() + "; tokens per micro-batch " + std::to_string(d.tokens) + ", " +
                     std::to_string(d.grad_accum) + " micro-batches per replica, " + std::to_string(d.data_size) +
                     " replicas";
  if (m.model.is_moe()) {
    text += "; capacity " + std::to_string(d.capacity) +
            (d.dtd_split ? " (C/t = " + std::to_string(d.capacity_per_rank) + " per TP rank)" : "");
  }
  return text;
}

}  // namespace tedsim::runtime
