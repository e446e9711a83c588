#pragma once
// Attention core per head, CPU fp32: S = Q K^T / sqrt(d), optional causal mask (key j > query i
// masked), P = softmax_rows(S), O = P V. Inputs are [heads, s, d] row-major (heads = b * a/t for
// the caller), q and k of head_dim d, v and O of v_dim (MLA's value heads differ from its
// query/key heads); P [heads, s, s] is saved for the backward pass.
namespace tedsim::kernels {

void attention_forward(int heads, int seq, int head_dim, int v_dim, bool causal, const float* q, const float* k,
                       const float* v, float* probs, float* out);
inline void attention_forward(int heads, int seq, int head_dim, bool causal, const float* q, const float* k,
                              const float* v, float* probs, float* out) {
  attention_forward(heads, seq, head_dim, head_dim, causal, q, k, v, probs, out);
}

// dV = P^T dO; dP = dO V^T; dS = P * (dP - rowsum(dP * P)); dQ = dS K / sqrt(d);
// dK = dS^T Q / sqrt(d). Outputs are overwritten.
void attention_backward(int heads, int seq, int head_dim, int v_dim, const float* q, const float* k, const float* v,
                        const float* probs, const float* grad_out, float* grad_q, float* grad_k, float* grad_v);
inline void attention_backward(int heads, int seq, int head_dim, const float* q, const float* k, const float* v,
                               const float* probs, const float* grad_out, float* grad_q, float* grad_k,
                               float* grad_v) {
  attention_backward(heads, seq, head_dim, head_dim, q, k, v, probs, grad_out, grad_q, grad_k, grad_v);
}

}  // namespace tedsim::kernels
