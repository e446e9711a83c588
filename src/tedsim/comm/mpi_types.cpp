#include "tedsim/comm/mpi_types.hpp"

#include <algorithm>

#include "tedsim/comm/half.hpp"

namespace tedsim {

MPI_Datatype mpi_datatype(Dtype dtype) {
  return dtype == Dtype::fp32 ? MPI_FLOAT : MPI_UINT16_T;
}

namespace {

template <Dtype D, ReduceOp Op>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = D == Dtype::fp16 ? half_to_float(a[i]) : bf16_to_float(a[i]);
    const float y = D == Dtype::fp16 ? half_to_float(b[i]) : bf16_to_float(b[i]);
    const float r = Op == ReduceOp::sum ? x + y : std::max(x, y);
    b[i] = D == Dtype::fp16 ? float_to_half(r) : float_to_bf16(r);
  }
}

MPI_Op create(MPI_User_function* fn) {
  MPI_Op op;
  MPI_Op_create(fn, /*commute=*/1, &op);
  return op;
}

}  // namespace

MPI_Op mpi_op(ReduceOp op, Dtype dtype) {
  if (dtype == Dtype::fp32) return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
  // Function-local statics: created once, after MPI_Init (the first collective), thread-safe.
  static const MPI_Op fp16_sum = create(&reduce_16bit<Dtype::fp16, ReduceOp::sum>);
  static const MPI_Op fp16_max = create(&reduce_16bit<Dtype::fp16, ReduceOp::max>);
  static const MPI_Op bf16_sum = create(&reduce_16bit<Dtype::bf16, ReduceOp::sum>);
  static const MPI_Op bf16_max = create(&reduce_16bit<Dtype::bf16, ReduceOp::max>);
  if (dtype == Dtype::fp16) return op == ReduceOp::sum ? fp16_sum : fp16_max;
  return op == ReduceOp::sum ? bf16_sum : bf16_max;
}

}  // namespace tedsim
