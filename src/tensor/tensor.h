#pragma once
// A contiguous row-major tensor: shape, dtype, device and a shared buffer. Copies share the
// buffer (like torch.Tensor); clone() copies the bytes. Buffers are 64-byte aligned and charged
// to a MemoryTracker category when one is given.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/memory.h"

namespace fsdp {

enum class Device : uint8_t { cpu, cuda };
using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[64, 1, 28, 28]"
// Host memory, 64-byte aligned for the vector loops (at least 64 bytes); std::free releases it.
void* aligned_host_alloc(size_t bytes);

class DeviceRuntime;

// Owns one allocation and reports it to the tracker for its whole lifetime: 64-byte aligned host
// memory, or memory of a DeviceRuntime (device.h), which charges its own tracker and returns the
// block to its caching allocator on the runtime's compute stream.
class Buffer {
 public:
  Buffer(size_t bytes, MemCategory category, MemoryTracker* tracker);
  Buffer(size_t bytes, MemCategory category, DeviceRuntime& runtime);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  // A packed buffer is unpacked first: whoever reads it early pays a pass, never a wrong value.
  void* data() const {
    if (packed_dtype_ != DType::f32) unpack();
    return data_;
  }
  size_t bytes() const { return bytes_; }  // as f32, packed or not

  // Activation storage in the dtype a pass computes in (nn/activation_stash.h): the buffer's f32
  // values, every one exactly a value of `dtype` (bf16 or f16: what RunCtx::round left), held in
  // that dtype, half the bytes, from a unit's forward to its backward. Lossless only for such
  // values (any other is rounded): the stash packs only what RunCtx::round rounded. The f32
  // memory is freed and allocated again by unpack, both in the buffer's own memory (the host, a
  // device, the memory plan's meta device), on its compute stream, through its kernels' cast.
  void pack(DType dtype);
  void unpack() const;
  bool packed() const { return packed_dtype_ != DType::f32; }
  // The packed values as they are (null when not packed), for a reader that takes them in that
  // dtype without widening the buffer (Linear's dW GEMM at matmul_precision medium).
  const void* packed_data() const { return packed() ? data_ : nullptr; }
  DType packed_dtype() const { return packed_dtype_; }  // f32: not packed

 private:
  void* allocate(size_t bytes) const;
  void release(void* ptr, size_t bytes) const;
  size_t held_bytes() const;  // of the current allocation: bytes_, or the packed size
  mutable void* data_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_;
  MemoryTracker* tracker_ = nullptr;
  DeviceRuntime* runtime_ = nullptr;
  mutable DType packed_dtype_ = DType::f32;  // f32: not packed
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, MemCategory category = MemCategory::other,
                      MemoryTracker* tracker = nullptr);
  static Tensor zeros(const Shape& shape, DType dtype, MemCategory category = MemCategory::other,
                      MemoryTracker* tracker = nullptr);
  // In the runtime's memory (device.h): host for the cpu runtime, the GPU for cuda. zero() and
  // clone() of such a tensor go through the runtime too.
  static Tensor empty(DeviceRuntime& runtime, const Shape& shape, DType dtype, MemCategory category);
  static Tensor zeros(DeviceRuntime& runtime, const Shape& shape, DType dtype, MemCategory category);
  DeviceRuntime* runtime() const { return runtime_; }  // null: plain host memory

  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t ndim() const { return shape_.size(); }
  int64_t numel() const { return numel_; }
  size_t bytes() const { return static_cast<size_t>(numel_) * dtype_bytes(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool defined() const { return buffer_ != nullptr; }

  void* raw() const { return buffer_ ? buffer_->data() : nullptr; }
  // The buffer itself, shared by every view and copy of this tensor (nn/activation_stash.h packs it).
  const std::shared_ptr<Buffer>& storage() const { return buffer_; }
  float* f32() const;    // checks dtype
  int32_t* i32() const;  // checks dtype

  // Same buffer, new shape of equal numel.
  Tensor view(const Shape& shape) const;
  Tensor clone(MemCategory category = MemCategory::other, MemoryTracker* tracker = nullptr) const;
  void zero();
  // True when this tensor already has this shape and dtype: layers reuse activation buffers.
  bool matches(const Shape& shape, DType dtype) const { return defined() && shape_ == shape && dtype_ == dtype; }

 private:
  Tensor(const Shape& shape, DType dtype) : shape_(shape), numel_(shape_numel(shape)), dtype_(dtype) {}
  std::shared_ptr<Buffer> buffer_;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
  DeviceRuntime* runtime_ = nullptr;
};

// Reallocates `t` only when its shape/dtype differ (batch size changes): the llm.c pattern of
// allocating activations once and reusing them every step.
void ensure(Tensor& t, const Shape& shape, DType dtype, MemCategory category, MemoryTracker* tracker);
void ensure(Tensor& t, const Shape& shape, DType dtype, MemCategory category, DeviceRuntime& runtime);

}  // namespace fsdp
