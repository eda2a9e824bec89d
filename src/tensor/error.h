#pragma once
// One exception type for everything a user can cause (bad input, files, options). main()
// catches it and prints its message as the single line the user sees.
#include <new>
#include <stdexcept>
#include <string>

namespace fsdp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// An error every rank raises at the same point with the same message, decided from all-reduced
// values or an agreement step (a diverged loss): printed once, and every rank ends normally
// instead of aborting the job.
class AgreedError : public Error {
 public:
  using Error::Error;
};

// An exception as the one line a user reads: its message, or "out of memory" for std::bad_alloc
// (whose what() says nothing useful). The apps print every error through it.
inline std::string describe(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return "out of memory";
  return e.what();
}

}  // namespace fsdp
