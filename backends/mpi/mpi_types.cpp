#include "mpi/mpi_types.h"

#include "mpi/mpi_reduce.h"

namespace fsdp {

namespace {

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// MPI calls these pairwise (inout = inout op in), so a multi-step MPI reduction rounds to the
// half type once per step; the shared-memory path reduces all n inputs in f32 and rounds once.
template <DType D, ReduceOp Op>
// NOLINTNEXTLINE(readability-non-const-parameter): the signature is MPI_User_function's
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const void* srcs[2] = {inout, in};
  mpi_reduce_many(inout, srcs, 2, static_cast<size_t>(*len), D, Op);
}

MPI_Datatype half_type() {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Type_contiguous(1, MPI_UINT16_T, &type);
  MPI_Type_commit(&type);
  return type;
}

MPI_Op user_op(MPI_User_function* fn) {
  MPI_Op op = MPI_OP_NULL;
  MPI_Op_create(fn, /*commute=*/1, &op);
  return op;
}

}  // namespace

MpiDatatypeHandle::~MpiDatatypeHandle() {
  if (type_ != MPI_DATATYPE_NULL && !mpi_finalized()) MPI_Type_free(&type_);
}

MpiOpHandle::~MpiOpHandle() {
  if (op_ != MPI_OP_NULL && !mpi_finalized()) MPI_Op_free(&op_);
}

MpiHalfTypes::MpiHalfTypes()
    : bf16_(half_type()),
      f16_(half_type()),
      bf16_ops_{MpiOpHandle(user_op(half_op<DType::bf16, ReduceOp::sum>)),
                MpiOpHandle(user_op(half_op<DType::bf16, ReduceOp::max>)),
                MpiOpHandle(user_op(half_op<DType::bf16, ReduceOp::min>))},
      f16_ops_{MpiOpHandle(user_op(half_op<DType::f16, ReduceOp::sum>)),
               MpiOpHandle(user_op(half_op<DType::f16, ReduceOp::max>)),
               MpiOpHandle(user_op(half_op<DType::f16, ReduceOp::min>))} {}

MPI_Datatype MpiHalfTypes::datatype(DType dtype) const {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::bf16: return bf16_.get();
    case DType::f16: return f16_.get();
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op MpiHalfTypes::op(DType dtype, ReduceOp op) const {
  int i = op == ReduceOp::max ? 1 : op == ReduceOp::min ? 2 : 0;
  if (dtype == DType::bf16) return bf16_ops_[i].get();
  if (dtype == DType::f16) return f16_ops_[i].get();
  return i == 1 ? MPI_MAX : i == 2 ? MPI_MIN : MPI_SUM;
}

}  // namespace fsdp
