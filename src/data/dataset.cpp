#include <string>

#include "data/data.h"
#include "tensor/error.h"

namespace fsdp {

void Dataset::check_fill(std::span<const int64_t> indices, const Tensor& inputs, const Tensor& targets) const {
  const int64_t count = static_cast<int64_t>(indices.size());
  const int64_t size = this->size();
  for (int64_t index : indices)
    if (index < 0 || index >= size)
      throw Error("dataset fill: sample index " + std::to_string(index) + " is out of range [0, " +
                  std::to_string(size) + ")");

  auto check = [count](const char* what, const Tensor& t, Shape sample_shape, DType dtype) {
    Shape want = {count};
    want.insert(want.end(), sample_shape.begin(), sample_shape.end());
    if (!t.matches(want, dtype) || t.device() != Device::cpu)
      throw Error(
          std::string("dataset fill: ") + what + " tensor is " +
          (t.defined() ? shape_str(t.shape()) + " " + std::string(dtype_name(t.dtype())) : std::string("undefined")) +
          ", expected cpu " + shape_str(want) + " " + std::string(dtype_name(dtype)));
  };
  check("inputs", inputs, input_shape(), input_dtype());
  check("targets", targets, target_shape(), DType::i32);
}

}  // namespace fsdp
