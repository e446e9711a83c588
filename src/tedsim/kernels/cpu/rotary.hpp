#pragma once
// Rotary position embeddings (Su et al. 2021, RoFormer), CPU fp32, the way Megatron-Core's
// apply_rotary_pos_emb and Hugging Face's Llama/Qwen/Mixtral apply them: the first rotary_dim
// elements of each head split into halves (x1, x2) = (x[:r/2], x[r/2:r]) and rotate by the angle
// pos * theta^(-2i/r) of each pair i ("rotate half", not interleaved); the rest of the head passes.
//   y1 = x1 cos - x2 sin,  y2 = x2 cos + x1 sin.
// The backward pass is the transpose, the rotation by minus the angle. The step applies it in
// place on the token rows of the qkv projection, to the query heads and the key heads.
namespace tedsim::kernels {

// The cos and sin of every (position, pair) for positions [0, seq): [seq, rotary_dim / 2] each,
// computed in double. Megatron-Core caches the same table once per sequence length.
void rotary_table(int seq, int rotary_dim, double theta, float* cos, float* sin);

// x: `rows` token rows of `row_stride` floats, sequences of `seq` positions one after another
// (row r is position r % seq); the first `heads` x head_dim floats of each row are the heads to
// rotate. In place.
void rotary_forward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
                    const float* sin, float* x);
// The gradient through rotary_forward, in place: the rows hold d(loss)/dy and end as d(loss)/dx.
void rotary_backward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
                     const float* sin, float* grad);

}  // namespace tedsim::kernels
