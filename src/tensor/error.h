#pragma once
// One exception type for everything a user can cause (bad input, files, options). main()
// catches it and prints its message as the single line the user sees.
#include <stdexcept>
#include <string>

namespace fsdp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace fsdp
