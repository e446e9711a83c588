#include "tedsim/runtime/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "tedsim/comm/ted_groups.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cpu/activations.hpp"
#include "tedsim/kernels/cpu/adam.hpp"
#include "tedsim/kernels/cpu/attention.hpp"
#include "tedsim/kernels/cpu/dispatch.hpp"
#include "tedsim/kernels/cpu/gating.hpp"
#include "tedsim/kernels/cpu/gemm.hpp"
#include "tedsim/kernels/cpu/layernorm.hpp"
#include "tedsim/runtime/data.hpp"

namespace tedsim::runtime {

const char* phase_key(int phase) {
  static const char* const keys[kPhaseCount] = {"compute",     "tp_allreduce", "tp_allgather", "ep_alltoall",
                                                "dp_grad_sync", "optimizer",    "other"};
  return phase >= 0 && phase < kPhaseCount ? keys[phase] : "?";
}

void require_step_backend(Backend backend) {
  if (backend == Backend::cpu) return;
  std::string why;
  const bool device = cuda_device_available(&why);
  throw RunError(std::string("--backend cuda: the CUDA backend of the training step is not built yet") +
                 (device ? "" : " (and there is no CUDA device here: " + why + ")") +
                 "; use --backend cpu");
}

namespace {

using Clock = std::chrono::steady_clock;
inline double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

constexpr float kLnEps = 1e-5f;

// Row-major GEMM helpers. C = A B, C = A B^T, C += A^T B.
void mm(int m, int n, int k, const float* a, const float* b, float* c, float beta = 0.0f) {
  kernels::GemmOp op;
  op.beta = beta;
  kernels::gemm(op, m, n, k, a, k, b, n, c, n);
}
void mm_bt(int m, int n, int k, const float* a, const float* b, float* c, float beta = 0.0f) {
  kernels::GemmOp op;
  op.trans_b = true;
  op.beta = beta;
  kernels::gemm(op, m, n, k, a, k, b, k, c, n);
}
// c[m,n] += a^T b with a stored [k,m], b stored [k,n].
void mm_at_acc(int m, int n, int k, const float* a, const float* b, float* c) {
  kernels::GemmOp op;
  op.trans_a = true;
  op.beta = 1.0f;
  kernels::gemm(op, m, n, k, a, m, b, n, c, n);
}

void add_into(std::size_t n, const float* a, float* y) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) y[i] += a[i];
}

enum class CommMode { live, record, replay };

struct LayerIds {
  bool moe = false;
  int ln1_g = -1, ln1_b = -1, qkv = -1, out = -1, ln2_g = -1, ln2_b = -1;
  int fc1 = -1, fc2 = -1, gate = -1, efc1 = -1, efc2 = -1;
};

struct LayerActs {
  Tensor xn1, mean1, rstd1, q, kx, vx, probs, ctxh, ctx, x1, xn2, mean2, rstd2;
  Tensor f1, a1;                                  // dense MLP
  Tensor logits, ein, ef1, ea1, cbuf;             // MoE
  kernels::GatingOutput gate;
  void release_all() {
    for (Tensor* t : {&xn1, &mean1, &rstd1, &q, &kx, &vx, &probs, &ctxh, &ctx, &x1, &xn2, &mean2, &rstd2, &f1, &a1,
                      &logits, &ein, &ef1, &ea1, &cbuf})
      release(*t);
  }
};

}  // namespace

struct Trainer::Impl {
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
  int a_l = 0, kv_l = 0, hd = 0, q_l = 0, kvd_l = 0, qkv_l = 0;
  int F = 0, F_l = 0, F1_l = 0;  // dense MLP: per-rank width and fc1 output width (2x for swiglu)
  int Fe = 0, F1e = 0;           // experts: per-rank width (F/t with expert TP, else F)
  int V = 0, V_l = 0, v0 = 0;
  int E = 0, El = 0, k = 1, C = 0, Cp = 0;
  bool swiglu = false, split = false, etp_split = false;
  int ga = 1, nmb_global = 1, replica = 0, d = 1;

  int emb = -1, lm = -1, lnf_g = -1, lnf_b = -1;
  std::vector<LayerIds> ids;

  // Activations.
  std::vector<Tensor> inputs;               // layer inputs (the checkpoints), L + 1 entries
  std::vector<LayerActs> acts;              // per layer without checkpointing, one (reused) with it
  std::vector<std::vector<Tensor>> stash;   // CAC: per layer, collective outputs of the first forward
  Tensor xf, lnf_mean, lnf_rstd, logits, red, gbuf, gtmp, gtmp2, scratch_out, lnd_g, lnd_b;
  Tensor send, recv, gath, gmoe, gw;        // MoE communication / gradient scratch
  std::vector<std::int32_t> tokens, targets;

  // Optimizer state for the owned shards.
  Tensor m_ne, v_ne, m_ex, v_ex;
  std::int64_t iter = 0;
  int adam_step = 0;

  // Collective bookkeeping.
  CommMode mode = CommMode::live;
  std::vector<Tensor>* cur_stash = nullptr;
  std::size_t stash_next = 0;
  PhaseSeconds phase{};
  std::uint64_t routing_sig = 0;
  double aux_sum = 0;

  Impl(Communicator& w, const ModelSpec& m, const ParallelConfig& c, const TrainerOptions& o)
      : world(w),
        model(m),
        cfg(c),
        opt(o),
        layout(w.size(), c.tp, c.ep, c.layout, c.expert_tp),
        data(o.data_file.empty() ? TokenSource(m.vocab, o.seed, o.data_noise)
                                 : TokenSource::from_file(o.data_file, m.vocab, c.seq_len > 0 ? c.seq_len : m.seq_len)) {
    if (cfg.gpus != world.size())
      throw InputError("training step: configuration is for " + std::to_string(cfg.gpus) + " ranks but MPI runs " +
                       std::to_string(world.size()));
    validate_config(cfg, model);
    groups = std::make_unique<TedGroups>(world, layout);
    tp = &groups->tensor();
    ep = &groups->expert();
    dp = &groups->data();
    edp = &groups->expert_data();
    setup_dims();
    register_params();
    store.finalize(opt.seed, dp->size(), edp->size());
    const std::size_t ne_shard = cfg.zero == 0 ? store.params(false).size() : store.params(false).size() / dp->size();
    const std::size_t ex_shard = cfg.zero == 0 ? store.params(true).size() : store.params(true).size() / edp->size();
    zeros(m_ne, ne_shard);
    zeros(v_ne, ne_shard);
    zeros(m_ex, ex_shard);
    zeros(v_ex, ex_shard);
    inputs.resize(L + 1);
    acts.resize(cfg.checkpoint ? 1 : L);
    stash.resize(L);
  }

  void setup_dims() {
    L = model.layers;
    t = cfg.tp;
    ti = tp->rank();
    e = model.is_moe() ? cfg.ep : 1;
    b = cfg.micro_batch;
    s = cfg.seq_len > 0 ? cfg.seq_len : model.seq_len;
    T = b * s;
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
    Fe = cfg.expert_tp ? F / t : F;
    F1e = swiglu ? 2 * Fe : Fe;
    V = model.vocab;
    V_l = V / t;
    v0 = ti * V_l;
    if (model.is_moe()) {
      E = model.moe.experts;
      El = E / e;
      k = model.moe.top_k;
      const int c0 = kernels::capacity(T, E, k, model.moe.capacity_factor, model.moe.min_capacity);
      C = (c0 + t - 1) / t * t;
      split = t > 1 && (cfg.dtd || !cfg.expert_tp);
      etp_split = split && cfg.expert_tp;
      Cp = split ? C / t : C;
    }
    d = dp->size();
    replica = dp->rank();
    ga = cfg.grad_accum();
    nmb_global = cfg.global_batch / b;
  }

  // ---------------------------------------------------------------- parameters
  int add_param(const std::string& name, const std::string& kind, int id, bool expert, bool tp_replicated, Slice sl,
                float mean, float stdv) {
    ParamInfo p;
    p.name = name;
    p.kind = kind;
    p.tensor_id = id;
    p.expert = expert;
    if (expert)
      p.primary = edp->rank() == 0;
    else
      p.primary = dp->rank() == 0 && (!tp_replicated || tp->rank() == 0);
    p.slice = std::move(sl);
    p.mean = mean;
    p.std = stdv;
    return store.add(std::move(p));
  }

  static Slice make_slice(int A, int R, int Cc, int a0, int a1, int r0, int r1, std::vector<std::pair<int, int>> cols) {
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

  void register_params() {
    const float sd = opt.init_std;
    const float sd_out = sd / std::sqrt(2.0f * L);
    const float sd_gate = opt.gate_init_std > 0 ? opt.gate_init_std : sd;
    const float lnn = opt.ln_init_noise;
    emb = add_param("embedding", "embedding", 1, false, false, make_slice(1, V, h, 0, 1, v0, v0 + V_l, {{0, h}}), 0, sd);
    lm = model.tie_embeddings
             ? emb
             : add_param("lm_head", "lm_head", 2, false, false, make_slice(1, V, h, 0, 1, v0, v0 + V_l, {{0, h}}), 0, sd);
    lnf_g = add_param("final_ln.gamma", "final_ln", 3, false, true, make_slice(1, 1, h, 0, 1, 0, 1, {{0, h}}), 1, lnn);
    lnf_b = add_param("final_ln.beta", "final_ln", 4, false, true, make_slice(1, 1, h, 0, 1, 0, 1, {{0, h}}), 0, lnn);
    const int kvd = model.kv_dim();
    ids.resize(L);
    for (int l = 0; l < L; ++l) {
      LayerIds& li = ids[l];
      const int base = 100 * (l + 1);
      const std::string p = "layer" + std::to_string(l) + ".";
      li.moe = model.is_moe_layer(l);
      li.ln1_g = add_param(p + "ln1.gamma", "ln", base + 0, false, true, make_slice(1, 1, h, 0, 1, 0, 1, {{0, h}}), 1, lnn);
      li.ln1_b = add_param(p + "ln1.beta", "ln", base + 1, false, true, make_slice(1, 1, h, 0, 1, 0, 1, {{0, h}}), 0, lnn);
      li.qkv = add_param(p + "attn.qkv", "attn_qkv", base + 2, false, false,
                         make_slice(1, h, h + 2 * kvd, 0, 1, 0, h,
                                    {{ti * q_l, (ti + 1) * q_l},
                                     {h + ti * kvd_l, h + (ti + 1) * kvd_l},
                                     {h + kvd + ti * kvd_l, h + kvd + (ti + 1) * kvd_l}}),
                         0, sd);
      li.out = add_param(p + "attn.out", "attn_out", base + 3, false, false,
                         make_slice(1, h, h, 0, 1, ti * q_l, (ti + 1) * q_l, {{0, h}}), 0, sd_out);
      li.ln2_g = add_param(p + "ln2.gamma", "ln", base + 4, false, true, make_slice(1, 1, h, 0, 1, 0, 1, {{0, h}}), 1, lnn);
      li.ln2_b = add_param(p + "ln2.beta", "ln", base + 5, false, true, make_slice(1, 1, h, 0, 1, 0, 1, {{0, h}}), 0, lnn);
      const int F1 = swiglu ? 2 * F : F;
      auto ffn_cols = [&](int width, int part) {
        std::vector<std::pair<int, int>> cols{{part * width, (part + 1) * width}};
        if (swiglu) cols.push_back({F + part * width, F + (part + 1) * width});
        return cols;
      };
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
        li.efc1 = add_param(p + "moe.experts.fc1", "expert_fc1", base + 9, true, false,
                            make_slice(E, h, F1, ei * El, (ei + 1) * El, 0, h, ffn_cols(Fe, part)), 0, sd);
        li.efc2 = add_param(p + "moe.experts.fc2", "expert_fc2", base + 10, true, false,
                            make_slice(E, F, h, ei * El, (ei + 1) * El, part * Fe, (part + 1) * Fe, {{0, h}}), 0,
                            sd_out);
      }
    }
  }

  float* P(int id) { return store.param(id); }
  float* G(int id) { return store.grad(id); }

  // ---------------------------------------------------------------- collectives
  // Every layer collective goes through here: timed into its phase, recorded into the layer's CAC
  // stash in the first forward, and replayed from it in the recompute.
  enum class Coll { all_reduce, all_gather, all_to_all };
  void collective(Coll kind, Communicator& comm, const float* sendbuf, float* recvbuf, std::size_t recv_count, int ph) {
    if (mode == CommMode::replay) {
      Tensor& saved = (*cur_stash)[stash_next++];
      std::memcpy(recvbuf, saved.data(), recv_count * sizeof(float));
      return;
    }
    const int n = comm.size();
    const double t0 = now_s();
    if (n == 1) {  // a group of one moves nothing: its copy counts as compute, as in the cost model
      if (sendbuf != recvbuf) std::memcpy(recvbuf, sendbuf, recv_count * sizeof(float));
    } else {
      switch (kind) {
        case Coll::all_reduce: comm.all_reduce(sendbuf, recvbuf, recv_count, Dtype::fp32); break;
        case Coll::all_gather: comm.all_gather(sendbuf, recvbuf, recv_count / n, Dtype::fp32); break;
        case Coll::all_to_all: comm.all_to_all(sendbuf, recvbuf, recv_count / n, Dtype::fp32); break;
      }
      comm.wait();
      phase[ph] += now_s() - t0;
    }
    if (mode == CommMode::record) {
      cur_stash->emplace_back(recvbuf, recvbuf + recv_count);
    }
  }
  void tp_allreduce(float* buf, std::size_t n) { collective(Coll::all_reduce, *tp, buf, buf, n, kTpAllReduce); }

  // ---------------------------------------------------------------- layout helpers
  // [E][C][h] -> this TP rank's capacity slice [E][Cp][h].
  void slice_cap(const float* src, float* dst) {
    for (int x = 0; x < E; ++x)
      std::memcpy(dst + static_cast<std::size_t>(x) * Cp * h, src + (static_cast<std::size_t>(x) * C + ti * Cp) * h,
                  sizeof(float) * Cp * h);
  }
  // Gathered [t][E][Cp][h] -> [E][C][h].
  void unslice_cap(const float* src, float* dst) {
    for (int r = 0; r < t; ++r)
      for (int x = 0; x < E; ++x)
        std::memcpy(dst + (static_cast<std::size_t>(x) * C + r * Cp) * h,
                    src + (static_cast<std::size_t>(r) * E + x) * Cp * h, sizeof(float) * Cp * h);
  }
  // [S][El][Cp][h] <-> [El][S][Cp][h].
  void to_expert_major(const float* src, float* dst, int S) {
    const std::size_t blk = static_cast<std::size_t>(Cp) * h;
    for (int sr = 0; sr < S; ++sr)
      for (int x = 0; x < El; ++x)
        std::memcpy(dst + (static_cast<std::size_t>(x) * S + sr) * blk, src + (static_cast<std::size_t>(sr) * El + x) * blk,
                    sizeof(float) * blk);
  }
  void from_expert_major(const float* src, float* dst, int S) {
    const std::size_t blk = static_cast<std::size_t>(Cp) * h;
    for (int sr = 0; sr < S; ++sr)
      for (int x = 0; x < El; ++x)
        std::memcpy(dst + (static_cast<std::size_t>(sr) * El + x) * blk, src + (static_cast<std::size_t>(x) * S + sr) * blk,
                    sizeof(float) * blk);
  }
  // qkv [T, qkv_l] -> q, kx, vx [b*a_l, s, hd] (kv heads repeated for grouped-query attention).
  void split_heads(const float* qkv, float* q, float* kx, float* vx) {
    const int grp = a_l / kv_l;
    for (int bi = 0; bi < b; ++bi)
      for (int p = 0; p < s; ++p) {
        const float* row = qkv + static_cast<std::size_t>(bi * s + p) * qkv_l;
        for (int hi = 0; hi < a_l; ++hi) {
          const std::size_t o = (static_cast<std::size_t>(bi * a_l + hi) * s + p) * hd;
          const int j = hi / grp;
          std::memcpy(q + o, row + hi * hd, sizeof(float) * hd);
          std::memcpy(kx + o, row + q_l + j * hd, sizeof(float) * hd);
          std::memcpy(vx + o, row + q_l + kvd_l + j * hd, sizeof(float) * hd);
        }
      }
  }
  void merge_heads_grad(const float* gq, const float* gk, const float* gv, float* gqkv) {
    const int grp = a_l / kv_l;
    std::memset(gqkv, 0, sizeof(float) * T * qkv_l);
    for (int bi = 0; bi < b; ++bi)
      for (int p = 0; p < s; ++p) {
        float* row = gqkv + static_cast<std::size_t>(bi * s + p) * qkv_l;
        for (int hi = 0; hi < a_l; ++hi) {
          const std::size_t o = (static_cast<std::size_t>(bi * a_l + hi) * s + p) * hd;
          const int j = hi / grp;
          std::memcpy(row + hi * hd, gq + o, sizeof(float) * hd);
          add_into(hd, gk + o, row + q_l + j * hd);
          add_into(hd, gv + o, row + q_l + kvd_l + j * hd);
        }
      }
  }
  // [b*a_l, s, hd] <-> [T, q_l].
  void heads_to_tokens(const float* src, float* dst) {
    for (int bi = 0; bi < b; ++bi)
      for (int hi = 0; hi < a_l; ++hi)
        for (int p = 0; p < s; ++p)
          std::memcpy(dst + static_cast<std::size_t>(bi * s + p) * q_l + hi * hd,
                      src + (static_cast<std::size_t>(bi * a_l + hi) * s + p) * hd, sizeof(float) * hd);
  }
  void tokens_to_heads(const float* src, float* dst) {
    for (int bi = 0; bi < b; ++bi)
      for (int hi = 0; hi < a_l; ++hi)
        for (int p = 0; p < s; ++p)
          std::memcpy(dst + (static_cast<std::size_t>(bi * a_l + hi) * s + p) * hd,
                      src + static_cast<std::size_t>(bi * s + p) * q_l + hi * hd, sizeof(float) * hd);
  }

  void activation_forward(int rows, int width, const float* x, float* y) {
    if (swiglu)
      kernels::swiglu_forward(rows, width, x, y);
    else
      kernels::gelu_forward(static_cast<std::size_t>(rows) * width, x, y);
  }
  void activation_backward(int rows, int width, const float* x, const float* gy, float* gx) {
    if (swiglu)
      kernels::swiglu_backward(rows, width, x, gy, gx);
    else
      kernels::gelu_backward(static_cast<std::size_t>(rows) * width, x, gy, gx);
  }

  // ---------------------------------------------------------------- layer forward
  void layer_forward(int l, const float* x, LayerActs& A, float* out) {
    const LayerIds& li = ids[l];
    const std::size_t Th = static_cast<std::size_t>(T) * h;
    // Attention.
    kernels::layernorm_forward(T, h, kLnEps, x, P(li.ln1_g), P(li.ln1_b), ensure(A.xn1, Th), ensure(A.mean1, T),
                               ensure(A.rstd1, T));
    Tensor& qkv = A.ctx;  // reused: qkv is dead once split into heads
    mm(T, qkv_l, h, A.xn1.data(), P(li.qkv), ensure(qkv, static_cast<std::size_t>(T) * qkv_l));
    const std::size_t hs = static_cast<std::size_t>(b) * a_l * s * hd;
    split_heads(qkv.data(), ensure(A.q, hs), ensure(A.kx, hs), ensure(A.vx, hs));
    kernels::attention_forward(b * a_l, s, hd, true, A.q.data(), A.kx.data(), A.vx.data(),
                               ensure(A.probs, static_cast<std::size_t>(b) * a_l * s * s), ensure(A.ctxh, hs));
    heads_to_tokens(A.ctxh.data(), ensure(A.ctx, static_cast<std::size_t>(T) * q_l));
    float* x1 = ensure(A.x1, Th);
    mm(T, h, q_l, A.ctx.data(), P(li.out), x1);
    tp_allreduce(x1, Th);
    add_into(Th, x, x1);
    // MLP or MoE.
    kernels::layernorm_forward(T, h, kLnEps, x1, P(li.ln2_g), P(li.ln2_b), ensure(A.xn2, Th), ensure(A.mean2, T),
                               ensure(A.rstd2, T));
    if (!li.moe) {
      mm(T, F1_l, h, A.xn2.data(), P(li.fc1), ensure(A.f1, static_cast<std::size_t>(T) * F1_l));
      activation_forward(T, F_l, A.f1.data(), ensure(A.a1, static_cast<std::size_t>(T) * F_l));
      mm(T, h, F_l, A.a1.data(), P(li.fc2), out);
      tp_allreduce(out, Th);
    } else {
      moe_forward(li, A, out);
    }
    add_into(Th, x1, out);
  }

  void moe_forward(const LayerIds& li, LayerActs& A, float* out) {
    const std::size_t ECh = static_cast<std::size_t>(E) * C * h;
    const std::size_t ECph = static_cast<std::size_t>(E) * Cp * h;
    mm(T, E, h, A.xn2.data(), P(li.gate), ensure(A.logits, static_cast<std::size_t>(T) * E));
    kernels::GatingConfig gc;
    gc.k = k;
    gc.capacity_factor = model.moe.capacity_factor;
    gc.min_capacity = C;  // the rounded capacity (>= the formula's)
    kernels::gating_forward(A.logits.data(), T, E, gc, A.gate);
    aux_sum += A.gate.aux_loss;
    for (int i = 0; i < T * k; ++i)
      routing_sig = mix64(routing_sig ^ static_cast<std::uint64_t>(A.gate.expert[i] * 131 + A.gate.position[i] + 7));
    float* dbuf = ensure(A.cbuf, ECh);  // cbuf reused as the dispatch buffer until the combine input is built
    kernels::dispatch(A.gate, A.xn2.data(), h, dbuf);
    const float* a2a_in = dbuf;
    if (split) {
      slice_cap(dbuf, ensure(send, ECph));
      a2a_in = send.data();
    }
    collective(Coll::all_to_all, *ep, a2a_in, ensure(recv, ECph), ECph, kEpAllToAll);
    const float* src = recv.data();
    int S = e;
    if (etp_split) {
      collective(Coll::all_gather, *tp, recv.data(), ensure(gath, ECph * t), ECph * t, kTpAllGather);
      src = gath.data();
      S = t * e;
    }
    const int R = S * Cp;  // rows per local expert
    const std::size_t rows_h = static_cast<std::size_t>(El) * R * h;
    to_expert_major(src, ensure(A.ein, rows_h), S);
    ensure(A.ef1, static_cast<std::size_t>(El) * R * F1e);
    ensure(A.ea1, static_cast<std::size_t>(El) * R * Fe);
    float* eout = ensure(gmoe, rows_h);
    for (int x = 0; x < El; ++x) {
      float* f1 = A.ef1.data() + static_cast<std::size_t>(x) * R * F1e;
      float* a1 = A.ea1.data() + static_cast<std::size_t>(x) * R * Fe;
      mm(R, F1e, h, A.ein.data() + static_cast<std::size_t>(x) * R * h, P(li.efc1) + static_cast<std::size_t>(x) * h * F1e, f1);
      activation_forward(R, Fe, f1, a1);
      mm(R, h, Fe, a1, P(li.efc2) + static_cast<std::size_t>(x) * Fe * h, eout + static_cast<std::size_t>(x) * R * h);
    }
    if (cfg.expert_tp && t > 1) tp_allreduce(eout, rows_h);
    float* back = ensure(gath, rows_h);
    from_expert_major(eout, back, S);
    const float* a2a_back = etp_split ? back + static_cast<std::size_t>(ti) * ECph : back;  // DTD drop
    collective(Coll::all_to_all, *ep, a2a_back, ensure(recv, ECph), ECph, kEpAllToAll);
    float* cb = ensure(A.cbuf, ECh);
    if (split) {
      collective(Coll::all_gather, *tp, recv.data(), ensure(send, ECph * t), ECph * t, kTpAllGather);
      unslice_cap(send.data(), cb);
    } else {
      std::memcpy(cb, recv.data(), sizeof(float) * ECh);
    }
    kernels::combine(A.gate, cb, h, out);
  }

  // ---------------------------------------------------------------- layer backward
  // g: gradient w.r.t. the layer output on entry, w.r.t. its input on exit.
  void layer_backward(int l, const float* x, LayerActs& A, float* g) {
    const LayerIds& li = ids[l];
    const std::size_t Th = static_cast<std::size_t>(T) * h;
    float* gxn = ensure(gtmp, Th);
    if (!li.moe) {
      float* ga1 = ensure(gw, static_cast<std::size_t>(T) * F_l);
      mm_bt(T, F_l, h, g, P(li.fc2), ga1);
      mm_at_acc(F_l, h, T, A.a1.data(), g, G(li.fc2));
      float* gf1 = ensure(gmoe, static_cast<std::size_t>(T) * F1_l);
      activation_backward(T, F_l, A.f1.data(), ga1, gf1);
      mm_at_acc(h, F1_l, T, A.xn2.data(), gf1, G(li.fc1));
      mm_bt(T, h, F1_l, gf1, P(li.fc1), gxn);
      tp_allreduce(gxn, Th);
    } else {
      moe_backward(li, A, g, gxn);
    }
    // LN2: g_x1 = g + LN2^T(gxn).
    float* gln = ensure(gtmp2, Th);
    ln_backward(A.x1.data(), li.ln2_g, li.ln2_b, A.mean2.data(), A.rstd2.data(), gxn, gln);
    add_into(Th, gln, g);  // g is now grad x1
    // Attention.
    float* gctx = ensure(gtmp, static_cast<std::size_t>(T) * q_l);
    mm_bt(T, q_l, h, g, P(li.out), gctx);
    mm_at_acc(q_l, h, T, A.ctx.data(), g, G(li.out));
    const std::size_t hs = static_cast<std::size_t>(b) * a_l * s * hd;
    float* gctxh = ensure(gmoe, 4 * hs);
    tokens_to_heads(gctx, gctxh);
    float *gq = gctxh + hs, *gk = gctxh + 2 * hs, *gv = gctxh + 3 * hs;
    kernels::attention_backward(b * a_l, s, hd, A.q.data(), A.kx.data(), A.vx.data(), A.probs.data(), gctxh, gq, gk, gv);
    float* gqkv = ensure(gw, static_cast<std::size_t>(T) * qkv_l);
    merge_heads_grad(gq, gk, gv, gqkv);
    mm_at_acc(h, qkv_l, T, A.xn1.data(), gqkv, G(li.qkv));
    float* gxn1 = ensure(gtmp, Th);
    mm_bt(T, h, qkv_l, gqkv, P(li.qkv), gxn1);
    tp_allreduce(gxn1, Th);
    ln_backward(x, li.ln1_g, li.ln1_b, A.mean1.data(), A.rstd1.data(), gxn1, gln);
    add_into(Th, gln, g);
  }

  void ln_backward(const float* x, int gid, int bid, const float* mean, const float* rstd, const float* gy, float* gx) {
    kernels::layernorm_backward(T, h, x, P(gid), mean, rstd, gy, gx, ensure(lnd_g, h), ensure(lnd_b, h));
    add_into(h, lnd_g.data(), G(gid));
    add_into(h, lnd_b.data(), G(bid));
  }

  void moe_backward(const LayerIds& li, LayerActs& A, const float* g, float* gxn) {
    const std::size_t ECh = static_cast<std::size_t>(E) * C * h;
    const std::size_t ECph = static_cast<std::size_t>(E) * Cp * h;
    std::vector<float> gweight(static_cast<std::size_t>(T) * k);
    float* gcb = ensure(send, std::max(ECh, ECph * t));
    kernels::combine_backward(A.gate, A.cbuf.data(), g, h, gcb, gweight.data());
    const float* a2a_in = gcb;
    if (split) {  // backward of the final all-gather: this rank's slice
      slice_cap(gcb, ensure(gath, ECph));
      a2a_in = gath.data();
    }
    collective(Coll::all_to_all, *ep, a2a_in, ensure(recv, ECph), ECph, kEpAllToAll);
    const float* src = recv.data();
    int S = e;
    if (etp_split) {  // backward of the DTD drop: all-gather
      collective(Coll::all_gather, *tp, recv.data(), ensure(gath, ECph * t), ECph * t, kTpAllGather);
      src = gath.data();
      S = t * e;
    }
    const int R = S * Cp;
    const std::size_t rows_h = static_cast<std::size_t>(El) * R * h;
    float* geout = ensure(gmoe, rows_h);
    to_expert_major(src, geout, S);
    Tensor& ga1 = scratch_out;
    ensure(ga1, static_cast<std::size_t>(R) * Fe);
    Tensor gf1;
    ensure(gf1, static_cast<std::size_t>(R) * F1e);
    float* gein = ensure(gw, rows_h);
    for (int x = 0; x < El; ++x) {
      const float* go = geout + static_cast<std::size_t>(x) * R * h;
      const float* w1 = P(li.efc1) + static_cast<std::size_t>(x) * h * F1e;
      const float* w2 = P(li.efc2) + static_cast<std::size_t>(x) * Fe * h;
      const float* f1 = A.ef1.data() + static_cast<std::size_t>(x) * R * F1e;
      const float* a1 = A.ea1.data() + static_cast<std::size_t>(x) * R * Fe;
      mm_bt(R, Fe, h, go, w2, ga1.data());
      mm_at_acc(Fe, h, R, a1, go, G(li.efc2) + static_cast<std::size_t>(x) * Fe * h);
      activation_backward(R, Fe, f1, ga1.data(), gf1.data());
      mm_at_acc(h, F1e, R, A.ein.data() + static_cast<std::size_t>(x) * R * h, gf1.data(),
                G(li.efc1) + static_cast<std::size_t>(x) * h * F1e);
      mm_bt(R, h, F1e, gf1.data(), w1, gein + static_cast<std::size_t>(x) * R * h);
    }
    if (cfg.expert_tp && t > 1) tp_allreduce(gein, rows_h);
    float* back = ensure(gmoe, rows_h);
    from_expert_major(gein, back, S);
    const float* a2a_back = etp_split ? back + static_cast<std::size_t>(ti) * ECph : back;  // backward of all-gather
    collective(Coll::all_to_all, *ep, a2a_back, ensure(recv, ECph), ECph, kEpAllToAll);
    float* gdb = ensure(gw, ECh);
    if (split) {  // backward of the DTD slice: all-gather
      collective(Coll::all_gather, *tp, recv.data(), ensure(send, ECph * t), ECph * t, kTpAllGather);
      unslice_cap(send.data(), gdb);
    } else {
      std::memcpy(gdb, recv.data(), sizeof(float) * ECh);
    }
    kernels::dispatch_backward(A.gate, gdb, h, gxn);
    // Gate.
    float* glog = ensure(gath, static_cast<std::size_t>(T) * E);
    kernels::gating_backward(A.gate, gweight.data(), opt.aux_loss_coef / static_cast<float>(nmb_global), glog);
    mm_at_acc(h, E, T, A.xn2.data(), glog, G(li.gate));
    mm_bt(T, h, E, glog, P(li.gate), gxn, 1.0f);
  }

  // ---------------------------------------------------------------- embedding, head, loss
  void embed_forward() {
    const double t0 = now_s();
    float* x = ensure(inputs[0], static_cast<std::size_t>(T) * h);
    const float* w = P(emb);
    for (int i = 0; i < T; ++i) {
      const int id = tokens[i] - v0;
      if (id >= 0 && id < V_l)
        std::memcpy(x + static_cast<std::size_t>(i) * h, w + static_cast<std::size_t>(id) * h, sizeof(float) * h);
      else
        std::memset(x + static_cast<std::size_t>(i) * h, 0, sizeof(float) * h);
    }
    phase[kOther] += now_s() - t0;
    CommMode saved = mode;
    mode = CommMode::live;
    tp_allreduce(x, static_cast<std::size_t>(T) * h);
    mode = saved;
  }

  // Final norm, LM head, vocabulary-parallel cross-entropy. Returns this micro-batch's mean CE; with
  // `backward`, leaves d(loss)/d(last hidden) in gbuf (loss scaled by 1/nmb_global).
  double head_and_loss(bool backward) {
    const std::size_t Th = static_cast<std::size_t>(T) * h;
    double t0 = now_s();
    kernels::layernorm_forward(T, h, kLnEps, inputs[L].data(), P(lnf_g), P(lnf_b), ensure(xf, Th), ensure(lnf_mean, T),
                               ensure(lnf_rstd, T));
    phase[kOther] += now_s() - t0;
    float* lg = ensure(logits, static_cast<std::size_t>(T) * V_l);
    mm_bt(T, V_l, h, xf.data(), P(lm), lg);
    t0 = now_s();
    float* r = ensure(red, 3 * static_cast<std::size_t>(T));
    float *mx = r, *se = r + T, *tg = r + 2 * T;
    for (int i = 0; i < T; ++i) {
      const float* row = lg + static_cast<std::size_t>(i) * V_l;
      float m = -std::numeric_limits<float>::infinity();
      for (int v = 0; v < V_l; ++v) m = std::max(m, row[v]);
      mx[i] = m;
      const int id = targets[i] - v0;
      tg[i] = (id >= 0 && id < V_l) ? row[id] : 0.0f;  // the target's logit, from its owner only
    }
    phase[kOther] += now_s() - t0;
    if (t > 1) {
      const double c0 = now_s();
      tp->all_reduce(mx, mx, T, Dtype::fp32, ReduceOp::max);
      phase[kTpAllReduce] += now_s() - c0;
    }
    t0 = now_s();
    for (int i = 0; i < T; ++i) {
      float* row = lg + static_cast<std::size_t>(i) * V_l;
      double sum = 0;
      for (int v = 0; v < V_l; ++v) {
        row[v] = std::exp(row[v] - mx[i]);  // logits become exp(l - max); the target's is recovered below
        sum += row[v];
      }
      se[i] = static_cast<float>(sum);
    }
    phase[kOther] += now_s() - t0;
    if (t > 1) tp_allreduce(se, 2 * static_cast<std::size_t>(T));
    t0 = now_s();
    double loss = 0;
    for (int i = 0; i < T; ++i) loss += std::log(static_cast<double>(se[i])) + mx[i] - tg[i];
    loss /= T;
    if (!backward) {
      phase[kOther] += now_s() - t0;
      return loss;
    }
    const float scale = 1.0f / (static_cast<float>(T) * static_cast<float>(nmb_global));
    for (int i = 0; i < T; ++i) {
      float* row = lg + static_cast<std::size_t>(i) * V_l;
      const float inv = scale / se[i];
      for (int v = 0; v < V_l; ++v) row[v] *= inv;
      const int id = targets[i] - v0;
      if (id >= 0 && id < V_l) row[id] -= scale;
    }
    phase[kOther] += now_s() - t0;
    mm_at_acc(V_l, h, T, lg, xf.data(), G(lm));
    float* gxf = ensure(gtmp, Th);
    mm(T, h, V_l, lg, P(lm), gxf);
    tp_allreduce(gxf, Th);
    t0 = now_s();
    float* g = ensure(gbuf, Th);
    kernels::layernorm_backward(T, h, inputs[L].data(), P(lnf_g), lnf_mean.data(), lnf_rstd.data(), gxf, g,
                                ensure(lnd_g, h), ensure(lnd_b, h));
    add_into(h, lnd_g.data(), G(lnf_g));
    add_into(h, lnd_b.data(), G(lnf_b));
    phase[kOther] += now_s() - t0;
    return loss;
  }

  void embed_backward() {
    const double t0 = now_s();
    float* gwt = G(emb);
    const float* g = gbuf.data();
    for (int i = 0; i < T; ++i) {
      const int id = tokens[i] - v0;
      if (id >= 0 && id < V_l) add_into(h, g + static_cast<std::size_t>(i) * h, gwt + static_cast<std::size_t>(id) * h);
    }
    phase[kOther] += now_s() - t0;
  }

  void load_micro_batch(std::int64_t it, int j) {
    tokens.resize(T);
    targets.resize(T);
    const std::int64_t group = static_cast<std::int64_t>(j) * d + replica;  // micro-batch group across replicas
    for (int i = 0; i < b; ++i) {
      const std::int64_t g = it * cfg.global_batch + group * b + i;
      data.sample(g, s, tokens.data() + static_cast<std::size_t>(i) * s, targets.data() + static_cast<std::size_t>(i) * s);
    }
  }

  // Forward (+ backward) of one micro-batch; returns its loss (CE + coef * aux).
  double micro_batch(bool backward, double* ce_out, double* aux_out) {
    aux_sum = 0;
    embed_forward();
    const bool ckpt = cfg.checkpoint && backward;
    for (int l = 0; l < L; ++l) {
      LayerActs& A = acts[cfg.checkpoint ? 0 : l];
      stash[l].clear();
      mode = ckpt && cfg.cac ? CommMode::record : CommMode::live;
      cur_stash = &stash[l];
      layer_forward(l, inputs[l].data(), A, ensure(inputs[l + 1], static_cast<std::size_t>(T) * h));
    }
    mode = CommMode::live;
    const double aux = aux_sum;
    const double ce = head_and_loss(backward);
    if (backward) {
      for (int l = L - 1; l >= 0; --l) {
        LayerActs& A = acts[cfg.checkpoint ? 0 : l];
        if (ckpt) {  // recompute this layer's forward from its checkpointed input
          mode = cfg.cac ? CommMode::replay : CommMode::live;
          cur_stash = &stash[l];
          stash_next = 0;
          const std::uint64_t sig = routing_sig;
          layer_forward(l, inputs[l].data(), A, ensure(scratch_out, static_cast<std::size_t>(T) * h));
          routing_sig = sig;
          mode = CommMode::live;
          stash[l].clear();
          stash[l].shrink_to_fit();
        }
        layer_backward(l, inputs[l].data(), A, gbuf.data());
      }
      embed_backward();
    }
    if (ce_out) *ce_out = ce;
    if (aux_out) *aux_out = aux;
    return ce + opt.aux_loss_coef * aux;
  }

  // Sum over this rank's micro-batches of (loss / nmb_global), and the CE / aux parts.
  std::array<double, 3> run_micro_batches(std::int64_t it, bool backward) {
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

  // ---------------------------------------------------------------- gradient sync + Adam
  void sync_and_update() {
    ++adam_step;
    kernels::AdamConfig ac;
    ac.lr = opt.lr;
    for (int expert = 0; expert < 2; ++expert) {
      Communicator& comm = expert ? *edp : *dp;
      Tensor& p = store.params(expert);
      Tensor& g = store.grads(expert);
      Tensor& m = expert ? m_ex : m_ne;
      Tensor& v = expert ? v_ex : v_ne;
      const int n = comm.size();
      const std::size_t total = p.size();
      const bool sharded = cfg.zero >= 1 && n > 1;
      const std::size_t count = sharded ? total / n : total;
      const std::size_t off = sharded ? static_cast<std::size_t>(comm.rank()) * count : 0;
      double t0 = now_s();
      if (n > 1) {
        if (sharded)
          comm.reduce_scatter(g.data(), g.data() + off, count, Dtype::fp32);
        else
          comm.all_reduce(g.data(), g.data(), total, Dtype::fp32);
        comm.wait();
        phase[kDpGradSync] += now_s() - t0;
      }
      t0 = now_s();
      const std::size_t tile = expert && cfg.tiled_optimizer ? std::max<std::size_t>(opt.optimizer_tile, 1) : count;
      for (std::size_t i = 0; i < count; i += tile) {
        const std::size_t len = std::min(tile, count - i);
        kernels::adam_step(len, ac, adam_step, p.data() + off + i, g.data() + off + i, m.data() + i, v.data() + i);
      }
      phase[kOptimizer] += now_s() - t0;
      if (sharded) {
        t0 = now_s();
        comm.all_gather(p.data() + off, p.data(), count, Dtype::fp32);
        comm.wait();
        phase[kDpGradSync] += now_s() - t0;
      }
    }
  }

  StepStats step() {
    phase.fill(0);
    const double t0 = now_s();
    store.zero_grads();
    std::array<double, 3> sums = run_micro_batches(iter, true);
    sync_and_update();
    const double t1 = now_s();
    // Global loss: sum of the replicas' shares (TP ranks of a replica hold the same numbers).
    float red3[3] = {static_cast<float>(sums[0]), static_cast<float>(sums[1]), static_cast<float>(sums[2])};
    if (d > 1) dp->all_reduce(red3, red3, 3, Dtype::fp32);
    StepStats st;
    st.loss = red3[0];
    st.ce_loss = red3[1];
    st.aux_loss = red3[2];
    st.seconds = t1 - t0;
    double other = 0;
    for (int p = 1; p < kPhaseCount; ++p) other += phase[p];
    phase[kCompute] = std::max(0.0, st.seconds - other);
    st.phase = phase;
    ++iter;
    return st;
  }

  std::vector<Checksum> checksums() {
    std::map<std::string, std::pair<double, double>> by_kind;
    std::vector<std::string> kinds = {"embedding", "lm_head",  "final_ln",   "ln",        "attn_qkv", "attn_out",
                                      "mlp_fc1",   "mlp_fc2",  "gate",       "expert_fc1", "expert_fc2"};
    for (const auto& k : kinds) by_kind[k] = {0, 0};
    for (std::size_t id = 0; id < store.infos().size(); ++id) {
      const ParamInfo& p = store.info(static_cast<int>(id));
      if (!p.primary) continue;
      const float* w = store.param(static_cast<int>(id));
      double sw = 0, sa = 0;
      for (std::size_t i = 0; i < p.numel; ++i) {
        const std::uint64_t hsh = mix64(static_cast<std::uint64_t>(p.tensor_id) * 1000003ULL + p.slice.global_index(i));
        sw += (1.0 + static_cast<double>(hsh & 0xff) / 256.0) * w[i];
        sa += std::fabs(w[i]);
      }
      by_kind[p.kind].first += sw;
      by_kind[p.kind].second += sa;
    }
    // Exact double sums over the world through host_max: each rank fills its own slots.
    const int n = world.size(), K = static_cast<int>(kinds.size());
    std::vector<double> all(static_cast<std::size_t>(n) * K * 2, -std::numeric_limits<double>::max());
    for (int i = 0; i < K; ++i) {
      all[(static_cast<std::size_t>(world.rank()) * K + i) * 2] = by_kind[kinds[i]].first;
      all[(static_cast<std::size_t>(world.rank()) * K + i) * 2 + 1] = by_kind[kinds[i]].second;
    }
    world.host_max(all);
    std::vector<Checksum> out;
    Checksum total{"all", 0, 0};
    for (int i = 0; i < K; ++i) {
      Checksum c{kinds[i], 0, 0};
      for (int r = 0; r < n; ++r) {
        c.weighted += all[(static_cast<std::size_t>(r) * K + i) * 2];
        c.abs += all[(static_cast<std::size_t>(r) * K + i) * 2 + 1];
      }
      total.weighted += c.weighted;
      total.abs += c.abs;
      out.push_back(c);
    }
    out.push_back(total);
    return out;
  }
};

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
std::vector<Checksum> Trainer::checksums() { return impl_->checksums(); }
ParamStore& Trainer::params() { return impl_->store; }
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
