#pragma once
// CUDA kernels the training step needs beyond cuda_kernels.hpp: the backward passes, the
// embedding and vocabulary-parallel cross-entropy, and the layout moves of attention heads and
// expert buffers. Plain C++ (no CUDA headers); every pointer is device memory; everything is fp32
// storage and is queued on the default stream (call synchronize() before reading results).
// Each function mirrors the CPU kernel or the CPU trainer helper named in its comment, with the
// same argument order and the same overwrite / accumulate contract, so the GPU tests can compare
// them one to one.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tedsim/kernels/cpu/gemm.hpp"
#include "tedsim/kernels/cpu/router.hpp"
#include "tedsim/kernels/cuda/cuda_kernels.hpp"

namespace tedsim::kernels::cuda {

// ---------------------------------------------------------------- memory
void* device_malloc(std::size_t bytes);                 // cudaMalloc; throws RunError naming the size
void device_free(void* ptr) noexcept;                   // cudaFree; ignores null
// cudaMemcpyDefault, synchronous for host endpoints: host<->device and device<->device.
void copy(void* dst, const void* src, std::size_t bytes);
// cudaMemcpy2DAsync device-to-device: `rows` rows of `row_bytes` each.
void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t row_bytes,
             std::size_t rows);
void fill_zero(void* ptr, std::size_t bytes);           // cudaMemsetAsync

// ---------------------------------------------------------------- GEMM
// Row-major fp32 A, B, C with cpu::gemm()'s semantics (GemmOp alpha/beta/transposes), multiplied
// on bf16 tensor cores with fp32 accumulation: A and B are first rounded to packed bf16 copies
// (convert_rows_to_bf16, into scratch the handle keeps), then multiplied as bf16 storage into fp32
// C. Rounding first makes the result one a CPU reference reproduces (round_to_bf16, then fp32
// sums); cuBLAS's own fp32-storage path (CUBLAS_COMPUTE_32F_FAST_16BF) rounds in ways no reference
// states. Both run below bf16 storage on an H200 (tests/gpu/bench_gpu_gemm.cpp, reports/device/).
void gemm_bf16_compute(BlasHandle& h, const GemmOp& op, int m, int n, int k, const float* a, int lda, const float* b,
                       int ldb, float* c, int ldc);
// gemm_bf16_compute with B already rounded: b16 is op(B)'s stored matrix as packed bf16 ([k,n], or
// [n,k] with op.trans_b; leading dimension its column count), as convert_rows_to_bf16 writes it.
// The step keeps such copies of its weights for a whole step (runtime/weight_copies.hpp) instead
// of rounding a weight on every GEMM that reads it. Only A is rounded here.
void gemm_bf16_compute_rounded_b(BlasHandle& h, const GemmOp& op, int m, int n, int k, const float* a, int lda,
                                 const void* b16, float* c, int ldc);
// dst [rows, cols] packed bf16 = src [rows, cols] (leading dimension ld >= cols) rounded to the
// nearest bf16, ties to even (cpu/bf16.hpp round_to_bf16).
void convert_rows_to_bf16(int rows, int cols, const float* src, int ld, void* dst);

// ---------------------------------------------------------------- element-wise
void add_into(std::size_t n, const float* a, float* y);  // y += a
void scale(std::size_t n, float alpha, float* y);        // y *= alpha

// ---------------------------------------------------------------- normalization / activations
// cpu/layernorm.hpp layernorm_backward: grad_x, grad_gamma, grad_beta overwritten.
void layernorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* mean,
                        const float* rstd, const float* grad_y, float* grad_x, float* grad_gamma, float* grad_beta);
// cpu/rmsnorm.hpp rmsnorm_forward (fp32): y [rows, h] and rstd [rows] overwritten.
void rmsnorm_forward(int rows, int hidden, float eps, const float* x, const float* gamma, float* y, float* rstd);
// cpu/rmsnorm.hpp rmsnorm_backward: grad_x and grad_gamma overwritten.
void rmsnorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* rstd,
                      const float* grad_y, float* grad_x, float* grad_gamma);
// cpu/rotary.hpp rotary_forward / rotary_backward (fp32): x rotated in place; cos and sin are
// cpu::rotary_table's [seq, rotary_dim / 2], copied to the device.
void rotary_forward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
                    const float* sin, float* x);
void rotary_backward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
                     const float* sin, float* grad);
// cpu/activations.hpp swiglu_backward (fp32): grad_x [rows, 2F] overwritten.
void swiglu_backward(int rows, int ffn, const float* x, const float* grad_y, float* grad_x);

// ---------------------------------------------------------------- FP8
// Whether this device multiplies FP8 on tensor cores (compute capability 8.9+); `why` says what
// the device is when it does not.
bool fp8_gemm_supported(std::string* why = nullptr);
// out[i] = x[i] * scale as E4M3 bytes (cpu/fp8.hpp round_to_e4m3: nearest, ties to even,
// saturating at 448).
void quantize_e4m3(const float* x, std::size_t n, float scale, void* out);
// Transformer Engine's FP8 linear, forward: C[m,n] (bf16) = (a_scale A[m,k]) (w_scale W[n,k])^T
// with A and W E4M3, row-major, W as a linear layer stores its weight; a_scale and w_scale are
// device floats (the inverses of the quantization scales). cuBLASLt with fp32 accumulation; m, n
// and k multiples of 16 (cuBLASLt's FP8 layouts); InputError otherwise.
void gemm_fp8(BlasHandle& h, int m, int n, int k, const void* a, const void* w, const float* a_scale,
              const float* w_scale, void* c);

// ---------------------------------------------------------------- attention
// Unfused: per-head batched GEMMs (TF32 tensor cores) around a row softmax kernel, one block per
// row of every head. The backward queues a stream-ordered scratch of heads * seq * seq floats.
// cpu/attention.hpp attention_forward: q, k [heads, s, head_dim], v, out [heads, s, v_dim];
// probs [heads, s, s] saved (masked entries 0).
void attention_forward_saving_probs(BlasHandle& blas, int heads, int seq, int head_dim, int v_dim, bool causal,
                                    const float* q, const float* k, const float* v, float* probs, float* out);
// cpu/attention.hpp attention_backward: grad_q, grad_k, grad_v overwritten.
void attention_backward(BlasHandle& blas, int heads, int seq, int head_dim, int v_dim, const float* q,
                        const float* k, const float* v, const float* probs, const float* grad_out, float* grad_q,
                        float* grad_k, float* grad_v);

// Head layouts of the trainer (runtime/layers/attention.cpp), b sequences of s tokens:
// qkv [b*s, q_l + 2*kvd_l] -> q, k, v [b*heads, s, hd], kv heads repeated heads/kv_heads times
// (heads must be a multiple of kv_heads: InputError otherwise).
void split_heads(int b, int s, int heads, int kv_heads, int hd, const float* qkv, float* q, float* k, float* v);
// Backward of split_heads: grad_qkv overwritten, repeated kv heads summed.
void merge_heads_grad(int b, int s, int heads, int kv_heads, int hd, const float* grad_q, const float* grad_k,
                      const float* grad_v, float* grad_qkv);
// [b*heads, s, hd] <-> [b*s, heads*hd].
void heads_to_tokens(int b, int s, int heads, int hd, const float* src, float* dst);
void tokens_to_heads(int b, int s, int heads, int hd, const float* src, float* dst);

// ---------------------------------------------------------------- MoE
// cpu/dispatch.hpp dispatch_backward / combine_backward with the gating arrays of DeviceGating
// (expert/position/weight [T,k]). Overwrite their outputs (combine_backward zero-fills all of
// grad_buf, having no kept counts, then writes the kept slots: the CPU's result).
void dispatch_backward(int tokens, int k, int experts, int capacity, int hidden, const int* expert,
                       const int* position, const float* grad_buf, float* grad_x);
void combine_backward(int tokens, int k, int experts, int capacity, int hidden, const int* expert,
                      const int* position, const float* weight, const float* buf, const float* grad_out,
                      float* grad_buf, float* grad_weight);
// cpu/gating.hpp gating_backward on the device gating output: grad_logits [T,E] overwritten.
void gating_backward(const DeviceGating& fwd, const float* grad_weight, float grad_aux, float* grad_logits);

// cpu/router.hpp's routers (softmax_topk, topk_softmax, sigmoid; group-limited; capacity or
// dropless) on the device, with the CPU's semantics, ties and operation order: `gate` holds what
// dispatch, combine and their backward read (a dropless capacity is the busiest expert's count,
// which the forward reads back to the host, as Megatron-Core's dropless dispatcher does), plus
// the sigmoid scores and the weights before dropping that the backward needs. No expert bias:
// the training step runs none. Groups: at most 64.
struct DeviceRouter {
  RouterConfig cfg;
  DeviceGating gate;
  DeviceBuffer scores;         // [T,E] sigmoid scores (sigmoid only)
  DeviceBuffer chosen_weight;  // [T,k]
  void download(RouterOutput& out) const;  // synchronous, for tests
};
void route_forward(const float* logits, int tokens, int experts, const RouterConfig& cfg, DeviceRouter& out);
// cpu/router.hpp route_backward: grad_logits [T,E] overwritten.
void route_backward(const DeviceRouter& fwd, const float* grad_weight, float grad_aux, float* grad_logits);

// ---------------------------------------------------------------- embedding and loss
// ids [T] global token ids (int32, device). Rows whose id is outside [v0, v0 + v_local) are zero.
void embedding_forward(int tokens, int hidden, int v0, int v_local, const std::int32_t* ids, const float* table,
                       float* out);
// table_grad[id - v0, :] += grad_out[t, :] for owned ids (atomic: ids repeat).
void embedding_backward(int tokens, int hidden, int v0, int v_local, const std::int32_t* ids, const float* grad_out,
                        float* table_grad);
// Vocabulary-parallel cross-entropy, as runtime/layers/lm_head.cpp does it on the CPU, in three steps
// around the tensor-group all-reduces:
// 1. row_max[t] = max_v logits[t, v]; target_logit[t] = logits[t, target - v0] if owned else 0.
void ce_max_and_target(int tokens, int v_local, int v0, const float* logits, const std::int32_t* targets,
                       float* row_max, float* target_logit);
// 2. logits[t, v] = exp(logits[t, v] - row_max[t]) in place; row_sum[t] = sum_v of those.
void ce_exp_and_sum(int tokens, int v_local, const float* row_max, float* logits, float* row_sum);
// 3. logits[t, v] = exp_logits[t, v] * scale / row_sum[t], minus scale at the owned target: the
//    gradient of scale * sum_t CE_t with respect to the logits.
void ce_gradient(int tokens, int v_local, int v0, const std::int32_t* targets, const float* row_sum, float scale,
                 float* logits);

}  // namespace tedsim::kernels::cuda
