// The library's precompiled header (meson: cpp_pch of libfsdp; -Db_pch=false builds without):
// the standard headers most of its translation units include, parsed once per build instead of
// once per unit. System headers only: a project header here would rebuild every unit when it
// changed. A unit still includes what it uses: the lint build (tests/lint.sh, b_pch off) parses
// each one without this.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>
