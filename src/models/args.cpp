#include "models/args.h"

#include <charconv>

#include "tensor/error.h"

namespace fsdp {

std::string arg_text(const ArgValue& v) {
  struct Text {
    std::string operator()(int64_t x) const { return std::to_string(x); }
    std::string operator()(double x) const {
      char text[32];
      const auto [end, ec] = std::to_chars(text, text + sizeof text, x);  // the shortest exact form
      return std::string(text, end);
    }
    std::string operator()(bool x) const { return x ? "true" : "false"; }
    std::string operator()(const std::string& x) const { return x; }
  };
  return std::visit(Text{}, v);
}

const char* arg_type_name(const ArgValue& v) {
  constexpr const char* kNames[] = {"integer", "number", "boolean", "string"};
  return kNames[v.index()];
}

template <class T>
const T& ModelArgs::get(std::string_view key) const {
  const ArgValue* v = find(key);
  if (!v) throw Error("model argument '" + std::string(key) + "' is not set (the family's table lacks it)");
  const T* x = std::get_if<T>(v);
  if (!x) throw Error("model argument '" + std::string(key) + "' is a " + arg_type_name(*v));
  return *x;
}

template const int64_t& ModelArgs::get<int64_t>(std::string_view) const;
template const double& ModelArgs::get<double>(std::string_view) const;
template const bool& ModelArgs::get<bool>(std::string_view) const;
template const std::string& ModelArgs::get<std::string>(std::string_view) const;

}  // namespace fsdp
