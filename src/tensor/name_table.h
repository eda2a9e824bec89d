#pragma once
// An enum's names as one table: the only place a name is spelled. Config validates against it
// (with "did you mean"), and the banner, the plan and the checkpoint attributes print from it.
// Each enum lives in the layer that acts on it (nn/attention_mode.h, data/kinds.h, optim/kinds.h,
// fsdp/strategy.h, ckpt/formats.h) with a name_table(E) overload; these templates work on any.
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace fsdp {

template <class E, size_t N>
using NameTable = std::array<std::pair<E, std::string_view>, N>;

template <class E, size_t N>
constexpr std::string_view name_of(const NameTable<E, N>& table, E value) {
  for (const auto& [e, name] : table)
    if (e == value) return name;
  return "?";
}

template <class E, size_t N>
constexpr std::optional<E> parse_name(const NameTable<E, N>& table, std::string_view text) {
  for (const auto& [e, name] : table)
    if (name == text) return e;
  return std::nullopt;
}

// "a, b or c": for messages.
template <class E, size_t N>
std::string names_of(const NameTable<E, N>& table) {
  std::string out;
  for (size_t i = 0; i < N; ++i)
    out += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(table[i].second);
  return out;
}

// The E whose name is `text`, or nothing (E's header declares name_table(E)).
template <class E>
constexpr std::optional<E> parse_enum(std::string_view text) {
  return parse_name(name_table(E{}), text);
}

// E's name: for messages, the banner and tests.
template <class E>
constexpr std::string_view enum_name(E e) {
  return name_of(name_table(e), e);
}

}  // namespace fsdp
