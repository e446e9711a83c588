#pragma once
// What every module of the training step shares (DESIGN.md section 8): the backend's ops, the
// process groups, the step's dimensions, the parameter store, the timed collectives (with CAC's
// record and replay), the phase clock, and the scratch tensors the layers reuse between calls.
// The modules (layers/, moe/, pipeline/, optimizer/) own their parameter ids and define their
// activations; they reach everything else through a StepContext.
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "tedsim/comm/communicator.hpp"
#include "tedsim/kernels/cpu/router.hpp"
#include "tedsim/runtime/params.hpp"
#include "tedsim/runtime/step_ops.hpp"
#include "tedsim/runtime/trainer.hpp"
#include "tedsim/spec/model_spec.hpp"
#include "tedsim/spec/parallel_config.hpp"

namespace tedsim::runtime {

using StepClock = std::chrono::steady_clock;
inline double now_s() { return std::chrono::duration<double>(StepClock::now().time_since_epoch()).count(); }

inline constexpr float kNormEps = 1e-5f;

// The shapes one rank of the step works with. Local means this rank's share of a split dimension.
struct StepDims {
  int layers = 0;
  int tensor_size = 1, tensor_rank = 0;  // the tensor group
  int expert_size = 1;                   // the expert group (1 for a dense model)
  int micro_batch = 1, seq = 0, tokens = 0, hidden = 0;  // tokens = micro_batch x seq
  // Sequence parallelism (Korthikanti et al. 2022): between tensor-parallel blocks this rank holds
  // rows [tensor_rank * local_tokens, ...) of the micro-batch's token rows; without it all of them.
  bool sequence_parallel = false;
  int local_tokens = 0;
  int routed_tokens = 0;  // the tokens the router of this rank routes (its local tokens)
  // Attention on this rank: heads, key/value heads, their width, and q + k + v side by side.
  int local_heads = 0, local_kv_heads = 0, head_dim = 0, local_q_width = 0, local_kv_width = 0, local_qkv_width = 0;
  int rotary_dim = 0;  // RoPE: the rotated dimensions of each query and key head (0: none)
  // Multi-head latent attention: the latent ranks (q_lora 0: queries projected directly), each
  // head's no-position and rotary query/key parts and its value size.
  bool mla = false;
  int q_lora = 0, kv_lora = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
  bool swiglu = false;
  int ffn_local = 0, ffn_fc1_local = 0;              // dense MLP: width, and fc1's output (2x with SwiGLU)
  int expert_width = 0;                              // a routed expert's full width
  int expert_width_local = 0, expert_fc1_local = 0;  // with expert TP its share, else whole
  int shared_width = 0, shared_width_local = 0, shared_fc1_local = 0;  // shared experts, side by side
  int vocab = 0, vocab_local = 0, vocab_first = 0;   // the vocabulary-parallel rows of this rank
  // MoE.
  int experts = 0, local_experts = 0, top_k = 1;
  int capacity = 0, capacity_per_rank = 0;  // capacity mode: C, and C/t where DTD slices it
  bool dropless = false;          // every token reaches its k experts (all-to-all-v exchange)
  bool generic_router = false;    // today's routers (kernels/cpu/router.hpp) rather than DeepSpeed's gating
  bool dtd_split = false;         // DTD: each tensor rank sends its slice of the dispatch buffer
  bool expert_tp_split = false;   // ... and the experts, split over t, gather every rank's slice
  bool sp_expert_gather = false;  // SP with expert TP: the experts see the tensor group's tokens
  // Micro-batches.
  int grad_accum = 1, global_micro_batches = 1, data_size = 1, replica = 0;
};

// The dimensions of `cfg` on a rank at `tensor_rank` of its tensor group and `replica` of
// `data_size` data-parallel replicas (step_dims.cpp). Throws InputError for what the step cannot
// run (dropout; SP over a token count t does not divide; dropless with DTD or with SP + expert TP).
StepDims step_dims(const ModelSpec& model, const ParallelConfig& cfg, int tensor_rank, int data_size, int replica);

// Scratch the layers reuse from call to call: one set per rank, not per layer, so the step holds
// what one layer at a time needs. A module uses a slot within one call, except where noted.
struct Workspace {
  // The MoE exchanges (send, receive, and the tensor group's gather of what was received); the
  // router's backward uses `gathered` for its logits' gradient.
  Tensor send, recv, gathered;
  // Two [tokens x a layer's widest width] slots: the experts' output rows and their gradients; the
  // attention's head-major gradients and its q/k/v gradient; the dense MLP's activation gradients.
  Tensor wide1, wide2;
  // d(loss)/d(routing weights): written by the dispatcher's combine backward, read by the router's.
  Tensor routing_weight_grad;
  // [Tl, h] gradients inside a layer's backward: the MLP/MoE block's input gradient, which the
  // layer then takes through its second norm, and the attention's; `hidden_grad2` the norms'.
  Tensor hidden_grad, hidden_grad2;
  // One expert's activation gradient in the experts' backward; a replayed layer's discarded output
  // under full recompute (the two never overlap).
  Tensor scratch;
  Tensor norm_gamma_grad, norm_beta_grad;
  Tensor sp_in, sp_part, sp_grad;  // SP: a block's gathered input, its partial output, the gathered gradient
  Tensor aux_stats, sp_grads;      // SP: the router's statistics; replicated gradients, packed
  Tensor shared_out, shared_act_grad, shared_fc1_grad, shared_in_grad;  // shared experts
  Tensor count_send, count_recv;   // dropless: row counts exchanged as floats (exact below 2^24)
};

// How a layer collective is run: live, live and recorded into CAC's stash (the first forward of a
// checkpointed layer), or replayed from it (the recompute).
enum class CommMode { live, record, replay };
enum class Coll { all_reduce, all_gather, reduce_scatter, all_to_all };

struct StepContext {
  StepOps& ops;
  Communicator& world;
  const ModelSpec& model;
  const ParallelConfig& cfg;
  const TrainerOptions& opt;
  ParamStore& store;
  Communicator *tp = nullptr, *ep = nullptr, *dp = nullptr, *edp = nullptr, *pipe = nullptr;
  StepDims dims;
  kernels::RouterConfig router_cfg;
  Workspace ws;
  Tensor rope_cos, rope_sin;  // RoPE's [seq, rotary_dim / 2] table, kept across steps

  // Collective bookkeeping.
  CommMode mode = CommMode::live;
  std::vector<Tensor>* cur_stash = nullptr;
  std::size_t stash_next = 0;
  PhaseSeconds phase{};
  std::vector<StepSlice> slices;  // this step's timed regions (opt.record_slices)
  double step_origin = 0;         // clock at the step's start

  // What the MoE layers report: the routing signature, the micro-batch's aux loss, the load imbalance.
  std::uint64_t routing_sig = 0;
  double aux_sum = 0;
  std::vector<double> imbalance_samples;  // with opt.track_imbalance: busiest expert / mean, per MoE layer pass
  std::vector<double> rank_load_samples;  // ... and the busiest expert rank's rows / the mean rank's
  std::vector<std::vector<std::int32_t>> expert_load_samples;  // opt.track_expert_loads: tokens per expert, per pass
  std::vector<std::int32_t> host_expert, host_position;  // host copies of routing choices

  StepContext(StepOps& o, Communicator& w, const ModelSpec& m, const ParallelConfig& c, const TrainerOptions& op,
              ParamStore& s)
      : ops(o), world(w), model(m), cfg(c), opt(op), store(s) {}

  // The step's clock: waits for queued device work first, so a phase timer measures the work.
  double clock() {
    ops.fence();
    return now_s();
  }
  // Charges [t0, t1] to phase `ph`, and keeps it as a slice named `name` when slices are recorded.
  void charge(int ph, const char* name, double t0, double t1) {
    phase[ph] += t1 - t0;
    if (opt.record_slices) slices.push_back({name, ph, t0 - step_origin, t1 - step_origin});
  }

  float* P(int id) { return store.param(id); }
  float* G(int id) { return store.grad(id); }

  // Row-major GEMMs. C = A W, C = A W^T, C += A^T B (a stored [k,m], b stored [k,n]). W is always
  // a weight, a block of a parameter unchanged within a step (StepOps::gemm_weight); in the weight
  // gradient's mm_at_acc both operands are activations or gradients.
  void mm(int m, int n, int k, const float* a, const float* w, float* c, float beta = 0.0f);
  void mm_bt(int m, int n, int k, const float* a, const float* w, float* c, float beta = 0.0f);
  void mm_at_acc(int m, int n, int k, const float* a, const float* b, float* c);
  void add_into(std::size_t n, const float* a, float* y) { ops.add_into(n, a, y); }
  HeadShape head_shape() const {
    return HeadShape{dims.micro_batch, dims.seq, dims.local_heads, dims.local_kv_heads, dims.head_dim};
  }
  // RoPE on the query and key heads of the qkv projection's [T, qkv_width] rows, in place, and
  // its gradient; nothing for a model without it. The cos/sin table is built on first use.
  void rotary_forward(float* qkv);
  void rotary_backward(float* grad_qkv);
  // RoPE (or its gradient) on `heads` heads of head_dim at x in each of the micro-batch's token
  // rows of row_stride floats (MLA: each query head's rope part, and the shared rope key).
  void rotary(float* x, int heads, int head_dim, int row_stride, bool backward);
  // The model's activation (GeLU, or SwiGLU over fc1's two halves) on rows x width outputs.
  void activation_forward(int rows, int width, const float* x, float* y);
  void activation_backward(int rows, int width, const float* x, const float* gy, float* gx);

  // Every layer collective goes through here: timed into its phase, recorded into the layer's CAC
  // stash in the first forward, and replayed from it in the recompute. A group of one moves
  // nothing: its copy counts as compute, as in the cost model.
  void collective(Coll kind, Communicator& comm, const float* sendbuf, float* recvbuf, std::size_t recv_count, int ph,
                  const char* name);
  void tp_allreduce(float* buf, std::size_t n, const char* name) {
    collective(Coll::all_reduce, *tp, buf, buf, n, kTpAllReduce, name);
  }
  // Uneven all-to-all over the expert group, counts in elements; recorded and replayed like the others.
  void all_to_all_v(const float* sendbuf, const std::vector<std::size_t>& send_counts, float* recvbuf,
                    const std::vector<std::size_t>& recv_counts, const char* name);

  // A tensor-parallel block's entry and exit (Megatron's column- and row-parallel pair;
  // tensor_parallel_block.cpp). With sequence parallelism the entry all-gathers the rank's token
  // rows into `full` [T, h] and the exit reduce-scatters the partial [T, h] output into this rank's
  // rows; without it the entry reads the input as is and the exit all-reduces in place (`partial`
  // is then `local`).
  const float* sp_gather(const float* local, Tensor& full, const char* name);
  float* block_output(float* local);
  void block_exit(float* partial, float* local, const char* allreduce_name, const char* sp_name);
};

}  // namespace tedsim::runtime
