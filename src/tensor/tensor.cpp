#include "tensor/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "tensor/device.h"
#include "tensor/error.h"
#include "tensor/kernels.h"

namespace fsdp {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error("negative dimension in shape " + shape_str(shape));
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

void* aligned_host_alloc(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p) throw std::bad_alloc();
  return p;
}

Buffer::Buffer(size_t bytes, MemCategory category, MemoryTracker* tracker)
    : data_(aligned_host_alloc(bytes)), bytes_(bytes), category_(category), tracker_(tracker) {
  if (tracker_) tracker_->on_alloc(category_, bytes_);
}

Buffer::Buffer(size_t bytes, MemCategory category, DeviceRuntime& runtime)
    : bytes_(bytes), category_(category), runtime_(&runtime) {
  data_ = runtime.allocate(bytes, category, runtime.compute_stream());
}

Buffer::~Buffer() { release(data_, held_bytes()); }

void* Buffer::allocate(size_t bytes) const {
  if (runtime_) return runtime_->allocate(bytes, category_, runtime_->compute_stream());
  void* p = aligned_host_alloc(bytes);
  if (tracker_) tracker_->on_alloc(category_, bytes);
  return p;
}

void Buffer::release(void* ptr, size_t bytes) const {
  if (runtime_) {
    runtime_->deallocate(ptr, bytes, category_, runtime_->compute_stream());
    return;
  }
  if (tracker_) tracker_->on_free(category_, bytes);
  std::free(ptr);
}

size_t Buffer::held_bytes() const { return packed() ? bytes_ / sizeof(float) * dtype_bytes(packed_dtype_) : bytes_; }

void Buffer::pack(DType dtype) {
  if (packed() || dtype == DType::f32 || bytes_ == 0) return;
  if (dtype_bytes(dtype) != 2) throw Error("Buffer::pack: " + std::string(dtype_name(dtype)) + " is not bf16 or f16");
  Kernels& k = runtime_ ? runtime_->kernels() : cpu_kernels();
  const int64_t n = static_cast<int64_t>(bytes_ / sizeof(float));
  void* packed_data = allocate(static_cast<size_t>(n) * 2);
  k.cast(packed_data, dtype, data_, DType::f32, n);
  // Stream-ordered: the f32 block goes back to the compute stream's cache after the cast.
  release(data_, bytes_);
  data_ = packed_data;
  packed_dtype_ = dtype;
}

void Buffer::unpack() const {
  if (!packed()) return;
  Kernels& k = runtime_ ? runtime_->kernels() : cpu_kernels();
  const int64_t n = static_cast<int64_t>(bytes_ / sizeof(float));
  void* f32_data = allocate(bytes_);
  k.cast(f32_data, DType::f32, data_, packed_dtype_, n);
  release(data_, held_bytes());
  data_ = f32_data;
  packed_dtype_ = DType::f32;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, MemCategory category, MemoryTracker* tracker) {
  Tensor t(shape, dtype);
  t.buffer_ = std::make_shared<Buffer>(t.bytes(), category, tracker);
  return t;
}

Tensor Tensor::empty(DeviceRuntime& runtime, const Shape& shape, DType dtype, MemCategory category) {
  Tensor t(shape, dtype);
  t.device_ = runtime.device();
  t.runtime_ = &runtime;
  t.buffer_ = std::make_shared<Buffer>(t.bytes(), category, runtime);
  return t;
}

Tensor Tensor::zeros(DeviceRuntime& runtime, const Shape& shape, DType dtype, MemCategory category) {
  Tensor t = empty(runtime, shape, dtype, category);
  t.zero();
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemCategory category, MemoryTracker* tracker) {
  Tensor t = empty(shape, dtype, category, tracker);
  t.zero();
  return t;
}

float* Tensor::f32() const {
  if (dtype_ != DType::f32) throw Error("tensor is " + std::string(dtype_name(dtype_)) + ", f32 expected");
  return static_cast<float*>(raw());
}

int32_t* Tensor::i32() const {
  if (dtype_ != DType::i32) throw Error("tensor is " + std::string(dtype_name(dtype_)) + ", i32 expected");
  return static_cast<int32_t*>(raw());
}

Tensor Tensor::view(const Shape& shape) const {
  if (shape_numel(shape) != numel_) throw Error("view " + shape_str(shape) + " does not match " + shape_str(shape_));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::clone(MemCategory category, MemoryTracker* tracker) const {
  if (runtime_) {  // same runtime, same device; the copy is stream-ordered like any kernel
    Tensor t = empty(*runtime_, shape_, dtype_, category);
    if (bytes())
      runtime_->copy_async(t.raw(), raw(), bytes(),
                           device_ == Device::cpu ? CopyKind::host_to_host : CopyKind::device_to_device,
                           runtime_->compute_stream());
    return t;
  }
  Tensor t = empty(shape_, dtype_, category, tracker);
  if (bytes()) std::memcpy(t.raw(), raw(), bytes());
  return t;
}

void Tensor::zero() {
  if (!bytes()) return;
  if (runtime_)
    runtime_->memset_async(raw(), 0, bytes(), runtime_->compute_stream());
  else
    std::memset(raw(), 0, bytes());
}

void ensure(Tensor& t, const Shape& shape, DType dtype, MemCategory category, MemoryTracker* tracker) {
  if (!t.matches(shape, dtype)) t = Tensor::empty(shape, dtype, category, tracker);
}

void ensure(Tensor& t, const Shape& shape, DType dtype, MemCategory category, DeviceRuntime& runtime) {
  if (!t.matches(shape, dtype) || t.runtime() != &runtime) t = Tensor::empty(runtime, shape, dtype, category);
}

}  // namespace fsdp
