#pragma once
// Dispatch (token -> expert buffer) and combine (expert buffer -> token) for MoE, CPU fp32.
// The expert buffer is [E, C, h] row-major; slot (e, pos) holds the token routed there.
// Dispatch is an unweighted gather (as DeepSpeed's dispatch einsum with the boolean mask);
// the gate weights are applied in combine.
#include "tedsim/kernels/cpu/gating.hpp"

namespace tedsim::kernels {

// buf[e,pos,:] = x[t,:] for every kept choice (t, j) with (e, pos) = (expert, position); every
// other slot of buf is zero-filled. x is [T,h], buf is [E,C,h] with E, C from `gate`.
void dispatch(const GatingOutput& gate, const float* x, int hidden, float* buf);

// out[t,:] = sum over kept choices j of weight[t,j] * buf[expert, position, :]; tokens with no
// kept choice get zeros.
void combine(const GatingOutput& gate, const float* buf, int hidden, float* out);

// Backward of dispatch: grad_x[t,:] = sum over kept choices of grad_buf[e,pos,:] (overwrites).
void dispatch_backward(const GatingOutput& gate, const float* grad_buf, int hidden, float* grad_x);

// Backward of combine: grad_buf[e,pos,:] = weight * grad_out[t,:] (empty slots zero) and
// grad_weight[t,j] = <grad_out[t,:], buf[e,pos,:]> (0 for dropped choices). Overwrites both.
void combine_backward(const GatingOutput& gate, const float* buf, const float* grad_out, int hidden,
                      float* grad_buf, float* grad_weight);

}  // namespace tedsim::kernels
