#pragma once
// Maps tedsim's Dtype and ReduceOp onto MPI. MPI has no fp16/bf16: they travel as MPI_UINT16_T
// and are reduced by user-defined operations that widen to float, combine, and round back.
#include <mpi.h>

#include "tedsim/comm/communicator.hpp"

namespace tedsim {

MPI_Datatype mpi_datatype(Dtype dtype);
MPI_Op mpi_op(ReduceOp op, Dtype dtype);  // created on first use, valid until MPI_Finalize

}  // namespace tedsim
