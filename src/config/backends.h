#pragma once
// The comm.backend values this build accepts: the backends Meson compiled in. Defined in a file
// backends/meson.build generates, so config checks them without depending on comm/.
#include <string>
#include <vector>

namespace fsdp {

std::vector<std::string> built_backend_names();

}  // namespace fsdp
