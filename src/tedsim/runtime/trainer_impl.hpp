#pragma once
// Internal to the runtime: the state of a Trainer (Trainer::Impl) and the helpers its parts share.
// trainer.cpp builds the groups and parameters and runs micro-batches and the step;
// trainer_layers.cpp runs the layers forward and backward; trainer_head.cpp the embedding, LM head
// and loss; trainer_sync.cpp the gradient sync, the optimizer and the checksums. Tensors live in
// the backend's memory and every operation on them goes through `ops` (step_ops.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <deque>
#include "tedsim/comm/ted_groups.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/spec/pipeline_layout.hpp"
#include "tedsim/spec/pipeline_schedule.hpp"
#include "tedsim/runtime/data.hpp"
#include "tedsim/runtime/step_ops.hpp"
#include "tedsim/runtime/trainer.hpp"

namespace tedsim::runtime {
namespace step_detail {

using Clock = std::chrono::steady_clock;
inline double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

constexpr float kLnEps = 1e-5f;

enum class CommMode { live, record, replay };

struct LayerIds {
  bool moe = false;
  int ln1_g = -1, ln1_b = -1, qkv = -1, out = -1, ln2_g = -1, ln2_b = -1;
  int fc1 = -1, fc2 = -1, gate = -1, efc1 = -1, efc2 = -1;
  int sfc1 = -1, sfc2 = -1;  // shared experts (a dense MLP beside the routed ones)
};

struct LayerActs {
  Tensor xn1, mean1, rstd1, q, kx, vx, probs, ctxh, ctx, x1, xn2, mean2, rstd2;
  Tensor f1, a1;                                  // dense MLP
  Tensor logits, ein, ef1, ea1, cbuf;             // MoE
  Tensor sf1, sa1;                                // shared experts
  std::unique_ptr<Routing> gate;                  // made by the ops on first use, reused
  // Dropless exchange of this layer's micro-batch: the busiest local expert's count (the dispatch
  // buffer's capacity), each expert's kept rows [E], and the rows received for each local expert
  // from each source rank of the expert group [S][El].
  int dl_capacity = 0;
  std::vector<std::int32_t> dl_kept, dl_recv;
  void release_all() {
    for (Tensor* t : {&xn1, &mean1, &rstd1, &q, &kx, &vx, &probs, &ctxh, &ctx, &x1, &xn2, &mean2, &rstd2, &f1, &a1,
                      &logits, &ein, &ef1, &ea1, &cbuf, &sf1, &sa1})
      release(*t);
  }
};

// What one micro-batch keeps on a pipeline stage between its forward and its backward passes.
// The Trainer's own members of the same names hold the micro-batch being run (swap_in_flight).
struct MicroBatchState {
  std::vector<Tensor> inputs;
  std::vector<LayerActs> acts;
  std::vector<std::vector<Tensor>> stash;
  std::vector<std::int32_t> tokens, targets;
  Tensor gbuf;
  double aux = 0;
};

// The names of a tensor-parallel MLP's collectives: the dense MLP's or the shared experts'.
struct MlpNames {
  const char *gather, *allreduce, *scatter, *gather_bwd, *scatter_bwd;
};

// An activation or gradient on its way to a neighbour stage, kept until MPI is done with it.
struct OutgoingMessage {
  std::uint64_t ticket = 0;
  Tensor data;
};

}  // namespace step_detail
using namespace step_detail;

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
  Communicator *tp = nullptr, *ep = nullptr, *dp = nullptr, *edp = nullptr;
  ParamStore store;
  TokenSource data;

  // Dimensions.
  int L = 0, t = 1, ti = 0, e = 1, b = 1, s = 0, T = 0, h = 0;
  // Sequence parallelism (Korthikanti et al. 2022, Megatron-Core): between tensor-parallel blocks
  // this rank holds rows [ti*Tl, (ti+1)*Tl) of the micro-batch's T token rows; without it Tl = T.
  // MoE layers route the rank's own Tl tokens (Tr = Tl; else every tensor rank routes all T).
  bool sp = false;
  int Tl = 0, Tr = 0;
  int a_l = 0, kv_l = 0, hd = 0, q_l = 0, kvd_l = 0, qkv_l = 0;
  int F = 0, F_l = 0, F1_l = 0;  // dense MLP: per-rank width and fc1 output width (2x for swiglu)
  int Fx = 0;                    // experts: full width (the model's expert_ffn)
  int Fe = 0, F1e = 0;           // experts: per-rank width (Fx/t with expert TP, else Fx)
  int Fs = 0, Fs_l = 0, F1s_l = 0;  // shared experts: all of them side by side, and per rank
  bool dropless = false;         // every token reaches its k experts (all-to-all-v exchange)
  bool generic_router = false;   // today's routers (kernels/cpu/router.hpp) rather than DeepSpeed's fused gating
  kernels::RouterConfig router_cfg;
  std::vector<double> imbalance_samples;  // with opt.track_imbalance: busiest expert / mean, per MoE layer pass
  int V = 0, V_l = 0, v0 = 0;
  int E = 0, El = 0, k = 1, C = 0, Cp = 0;
  bool swiglu = false, split = false, etp_split = false;
  bool sp_expert_gather = false;  // SP with expert TP: the experts see the tensor group's tokens
  int ga = 1, nmb_global = 1, replica = 0, d = 1;
  // Pipeline: this rank's stage of `pipeline_stages`, each holding `pipeline_chunks` model chunks.
  int pipeline_stages = 1, pipeline_chunks = 1, stage = 0;
  StageMap stage_map;
  Communicator* pipe = nullptr;         // the ranks of this rank's inner position, one per stage
  std::unique_ptr<Communicator> tied;   // first and last stage, for a tied embedding's gradient
  std::map<int, std::unique_ptr<MicroBatchState>> in_flight;  // by micro-batch
  std::deque<OutgoingMessage> outgoing;

  int emb = -1, lm = -1, lnf_g = -1, lnf_b = -1;
  std::vector<LayerIds> ids;

  // Activations.
  std::vector<Tensor> inputs;               // layer inputs (the checkpoints), L + 1 entries
  std::vector<LayerActs> acts;              // per layer without checkpointing, one (reused) with it
  std::vector<std::vector<Tensor>> stash;   // CAC: per layer, collective outputs of the first forward
  Tensor xf, lnf_mean, lnf_rstd, logits, red, gbuf, gtmp, gtmp2, scratch_out, lnd_g, lnd_b;
  Tensor send, recv, gath, gmoe, gw, gweight;  // MoE communication / gradient scratch
  Tensor sp_in, sp_part, sp_grad, xf_full;     // SP: a block's gathered input, its partial output,
                                               // the gathered gradient; the head's gathered input
  Tensor aux_stats, sp_grads;                  // SP: the router's statistics; replicated grads
  Tensor shared_out, sh_ga, sh_gf, sh_gx;      // shared experts' output and gradient scratch
  Tensor dl_send_counts, dl_recv_counts;       // dropless: counts exchanged as floats (exact below 2^24)
  Tensor loss_sums;                            // the step's loss shares, reduced over replicas
  std::vector<std::int32_t> tokens, targets;  // host: the ops upload what they need
  std::vector<float> host_red;                // host copy of the cross-entropy row statistics
  std::vector<std::int32_t> host_expert, host_position;  // host copies of routing choices

  // Optimizer state for the owned shards.
  Tensor m_ne, v_ne, m_ex, v_ex;
  // ZeRO-3 (trainer_zero3.cpp), per buffer (0 non-expert, 1 expert) where its group has more than
  // one rank: parameters owned by shard unit (0 the embedding, 1 + l layer l, L + 1 the head) and
  // gathered before use; the owned shards' gradients accumulated in `grad_shard`, unit after unit
  // in the order of m and v (unit u's at shard_at[b][u]).
  bool zero3[2] = {false, false};
  Tensor grad_shard[2], zero3_scratch;
  std::vector<std::size_t> shard_at[2];
  int registering_unit = 0;  // the unit add_param gives a parameter
  std::int64_t iter = 0;
  int adam_step = 0;

  // Collective bookkeeping.
  CommMode mode = CommMode::live;
  std::vector<Tensor>* cur_stash = nullptr;
  std::size_t stash_next = 0;
  PhaseSeconds phase{};
  std::vector<StepSlice> slices;  // this step's timed regions (opt.record_slices)
  double step_origin = 0;         // clock at the step's start
  std::uint64_t routing_sig = 0;
  double aux_sum = 0;

  Impl(Communicator& w, const ModelSpec& m, const ParallelConfig& c, const TrainerOptions& o);
  // Buffers of sends still in flight (a step ended by an exception) are left to the process's end
  // rather than freed under MPI.
  ~Impl();

  void setup_dims();

  // The step's clock: waits for queued device work first, so a phase timer measures the work.
  double clock() {
    ops.fence();
    return now_s();
  }

  // Row-major GEMM helpers. C = A B, C = A B^T, C += A^T B (a stored [k,m], b stored [k,n]).
  void mm(int m, int n, int kk, const float* a, const float* bm, float* c, float beta = 0.0f) {
    kernels::GemmOp op;
    op.beta = beta;
    ops.gemm(op, m, n, kk, a, kk, bm, n, c, n);
  }
  void mm_bt(int m, int n, int kk, const float* a, const float* bm, float* c, float beta = 0.0f) {
    kernels::GemmOp op;
    op.trans_b = true;
    op.beta = beta;
    ops.gemm(op, m, n, kk, a, kk, bm, kk, c, n);
  }
  void mm_at_acc(int m, int n, int kk, const float* a, const float* bm, float* c) {
    kernels::GemmOp op;
    op.trans_a = true;
    op.beta = 1.0f;
    ops.gemm(op, m, n, kk, a, m, bm, n, c, n);
  }
  void add_into(std::size_t n, const float* a, float* y) { ops.add_into(n, a, y); }
  HeadShape head_shape() const { return HeadShape{b, s, a_l, kv_l, hd}; }

  // ---------------------------------------------------------------- parameters
  int add_param(const std::string& name, const std::string& kind, int id, bool expert, bool tp_replicated, Slice sl,
                float mean, float stdv, bool copy = false);

  static Slice make_slice(int A, int R, int Cc, int a0, int a1, int r0, int r1, std::vector<std::pair<int, int>> cols);

  void register_params();

  float* P(int id) { return store.param(id); }
  float* G(int id) { return store.grad(id); }

  // ---------------------------------------------------------------- collectives
  // Every layer collective goes through here: timed into its phase, recorded into the layer's CAC
  // stash in the first forward, and replayed from it in the recompute.
  enum class Coll { all_reduce, all_gather, reduce_scatter, all_to_all };
  void collective(Coll kind, Communicator& comm, const float* sendbuf, float* recvbuf, std::size_t recv_count, int ph,
                  const char* name);
  void tp_allreduce(float* buf, std::size_t n, const char* name) {
    collective(Coll::all_reduce, *tp, buf, buf, n, kTpAllReduce, name);
  }
  // Charges [t0, t1] to phase `ph`, and keeps it as a slice named `name` when slices are recorded.
  void charge(int ph, const char* name, double t0, double t1) {
    phase[ph] += t1 - t0;
    if (opt.record_slices) slices.push_back({name, ph, t0 - step_origin, t1 - step_origin});
  }
  // A tensor-parallel block's entry and exit (Megatron's column- and row-parallel pair). With
  // sequence parallelism the entry all-gathers the rank's token rows into `full` [T, h] and the
  // exit reduce-scatters the partial [T, h] output into this rank's rows; without it the entry
  // reads the input as is and the exit all-reduces in place (`partial` is then `local`).
  const float* sp_gather(const float* local, Tensor& full, const char* name);
  float* block_output(float* local) { return sp ? ensure(sp_part, static_cast<std::size_t>(T) * h) : local; }
  void block_exit(float* partial, float* local, const char* allreduce_name, const char* sp_name);
  // SP: the router's aux-loss statistics summed over the tensor group (trainer_sequence_parallel.cpp).
  void group_aux(Routing& r);
  // SP: the gradients of parameters every tensor rank holds whole (norms, router) summed over
  // the tensor group, each rank having computed them on its own tokens.
  void sync_sequence_parallel_grads(int only_unit = -1);  // -1: every parameter but ZeRO-3's layer units'
  // Uneven all-to-all over the expert group, counts in elements; recorded and replayed like the others.
  void all_to_all_v(const float* sendbuf, const std::vector<std::size_t>& send_counts, float* recvbuf,
                    const std::vector<std::size_t>& recv_counts, const char* name);

  // ---------------------------------------------------------------- layout helpers
  // [E][C][h] -> this TP rank's capacity slice [E][Cp][h].
  void slice_cap(const float* src, float* dst);
  // Gathered [t][E][Cp][h] -> [E][C][h].
  void unslice_cap(const float* src, float* dst);
  // [S][El][Cp][h] <-> [El][S][Cp][h].
  void to_expert_major(const float* src, float* dst, int S);
  void from_expert_major(const float* src, float* dst, int S);

  void activation_forward(int rows, int width, const float* x, float* y);
  void activation_backward(int rows, int width, const float* x, const float* gy, float* gx);

  // ---------------------------------------------------------------- layer forward
  void layer_forward(int l, const float* x, LayerActs& A, float* out);

  void moe_forward(const LayerIds& li, LayerActs& A, float* out);
  void route(const LayerIds& li, LayerActs& A);
  void mlp_forward(const float* in, int width_l, int fc1_l, int fc1, int fc2, Tensor& f1, Tensor& a1, float* out,
                   const MlpNames& names);
  void mlp_backward(const float* in, int width_l, int fc1_l, int fc1, int fc2, const Tensor& f1, const Tensor& a1,
                    const float* g, float* gx, Tensor& ga_scratch, Tensor& gf_scratch, const MlpNames& names);
  void shared_forward(const LayerIds& li, LayerActs& A);  // into shared_out, all-reduced
  void shared_backward(const LayerIds& li, LayerActs& A, const float* g, float* gxn);  // adds into gxn
  // Dropless: the dispatch buffer [E][C][h] of kept rows <-> each local expert's rows from every
  // source, expert-major, over all_to_all_v; and the experts on those variable row counts.
  void dropless_exchange_out(LayerActs& A, const float* dbuf, float* expert_rows);
  void dropless_exchange_back(LayerActs& A, const float* expert_rows, float* dbuf);
  void dropless_experts_forward(const LayerIds& li, LayerActs& A, float* out);
  void dropless_experts_backward(const LayerIds& li, LayerActs& A, const float* g, float* gxn);
  // Capacity mode: the fixed [E][C][h] buffers, DTD's split, all_to_all.
  void capacity_experts_forward(const LayerIds& li, LayerActs& A, float* out);
  void capacity_experts_backward(const LayerIds& li, LayerActs& A, const float* g, float* gxn);

  // ---------------------------------------------------------------- layer backward
  // g: gradient w.r.t. the layer output on entry, w.r.t. its input on exit.
  void layer_backward(int l, const float* x, LayerActs& A, float* g);

  // The model's norm (layernorm, or RMSNorm without a beta: bid -1) forward and backward over T rows.
  void norm_forward(const float* x, int gid, int bid, float* y, Tensor& mean, Tensor& rstd);
  void ln_backward(const float* x, int gid, int bid, const float* mean, const float* rstd, const float* gy, float* gx);

  void moe_backward(const LayerIds& li, LayerActs& A, const float* g, float* gxn);

  // ---------------------------------------------------------------- embedding, head, loss
  void embed_forward();

  // Final norm, LM head, vocabulary-parallel cross-entropy. Returns this micro-batch's mean CE; with
  // `backward`, leaves d(loss)/d(last hidden) in gbuf (loss scaled by 1/nmb_global).
  double head_and_loss(bool backward);

  void embed_backward();

  void load_micro_batch(std::int64_t it, int j);

  // Forward (+ backward) of one micro-batch; returns its loss (CE + coef * aux).
  double micro_batch(bool backward, double* ce_out, double* aux_out);

  // Sum over this rank's micro-batches of (loss / nmb_global), and the CE / aux parts.
  std::array<double, 3> run_micro_batches(std::int64_t it, bool backward);
  std::array<double, 3> run_one_stage(std::int64_t it, bool backward);  // without pipeline stages

  // ---------------------------------------------------------------- pipeline (trainer_pipeline.cpp)
  bool holds_layer(int l) const;
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == pipeline_stages - 1; }
  void swap_in_flight(MicroBatchState& s);
  MicroBatchState& in_flight_state(std::int64_t it, int mb);
  void chunk_forward(const ModelChunk& chunk, bool backward_follows);
  void chunk_backward(const ModelChunk& chunk);
  void send_to_stage(int to_stage, const float* data, std::size_t count);
  void receive_from_stage(int from_stage, float* data, std::size_t count);
  void release_sent();
  // The pipeline's run_micro_batches: every pass of this stage in the schedule's order.
  std::array<double, 3> run_pipeline(std::int64_t it, bool backward);
  void sync_tied_embedding();

  // ---------------------------------------------------------------- ZeRO-3 (trainer_zero3.cpp)
  Communicator& sync_group(int buffer) { return buffer ? *edp : *dp; }
  void setup_zero3();
  // All-gathers unit u's parameters from their owners (before its forward, its recompute and its
  // backward, as DeepSpeed stage 3 does).
  void gather_unit(int u);
  // After a layer's backward, every micro-batch: its gradients reduce-scattered into the owned
  // shard (SP's replicated ones summed over the tensor group first), the full ones zeroed.
  void reduce_unit_grads(int u);
  // Unit u's gradients in buffer b reduce-scattered and added to the owned shard; false where
  // buffer b is not sharded or the unit has none of its parameters.
  bool reduce_into_shard(int b, int u);
  // The step's end: the embedding's and the head's units (after the tied-embedding sync), then Adam
  // on every owned shard; the parameters stay sharded until gathered for use.
  void zero3_sync_and_update(int buffer, const kernels::AdamConfig& ac);
  // Every unit gathered (checksums read whole parameters).
  void gather_all_units();

  // ---------------------------------------------------------------- gradient sync + Adam
  void check_finite(double loss_share);
  void sync_and_update();

  StepStats step();

  std::vector<Checksum> checksums();
};

}  // namespace tedsim::runtime
