#pragma once
// MPI datatypes and reduction ops for every DType, the half types included: MPI has no bf16 or
// f16, so they are derived 2-byte types with user ops that reduce in f32 and round once per
// call (mpi_reduce.h). One definition for the MPI backend and for fsdp_bench's raw-MPI baseline,
// so the baseline reduces exactly as the backend does.
#include <mpi.h>

#include "comm/comm.h"

namespace fsdp {

// Owns a committed derived datatype: freed on destruction unless MPI is already finalized.
class MpiDatatypeHandle {
 public:
  MpiDatatypeHandle() = default;
  explicit MpiDatatypeHandle(MPI_Datatype type) : type_(type) {}
  ~MpiDatatypeHandle();
  MpiDatatypeHandle(const MpiDatatypeHandle&) = delete;
  MpiDatatypeHandle& operator=(const MpiDatatypeHandle&) = delete;
  MpiDatatypeHandle(MpiDatatypeHandle&&) = delete;
  MpiDatatypeHandle& operator=(MpiDatatypeHandle&&) = delete;
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// Owns a user-defined op: freed on destruction unless MPI is already finalized.
class MpiOpHandle {
 public:
  MpiOpHandle() = default;
  explicit MpiOpHandle(MPI_Op op) : op_(op) {}
  ~MpiOpHandle();
  MpiOpHandle(const MpiOpHandle&) = delete;
  MpiOpHandle& operator=(const MpiOpHandle&) = delete;
  MpiOpHandle(MpiOpHandle&&) = delete;
  MpiOpHandle& operator=(MpiOpHandle&&) = delete;
  MPI_Op get() const { return op_; }

 private:
  MPI_Op op_ = MPI_OP_NULL;
};

// The datatypes and ops of every DType and ReduceOp. Built after MPI_Init; shared by a
// communicator and every communicator split from it (their lifetimes differ, so by shared_ptr).
class MpiHalfTypes {
 public:
  MpiHalfTypes();
  MPI_Datatype datatype(DType dtype) const;   // any DType
  MPI_Op op(DType dtype, ReduceOp op) const;  // avg maps to sum (scaled afterwards)

 private:
  MpiDatatypeHandle bf16_, f16_;
  MpiOpHandle bf16_ops_[3], f16_ops_[3];  // sum, max, min
};

}  // namespace fsdp
