#pragma once
// The input file's enumerated values, each as an enum with one table of its names. The table
// is the only place a name is spelled: config validates against it (with "did you mean"), and the
// banner, the plan and the checkpoint attributes print from it. A leaf header: the layers that
// act on these values (fsdp, optim, models, ckpt) include it without depending on config.
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

// The transformer's attention (nn/layers.h, MultiheadAttention): keep the (B, H, T, T)
// probabilities for the backward, or only each row's max and 1/sum and recompute the scores, or
// (a GPU's) cuDNN's fused flash attention in bf16, which keeps each row's log-sum-exp.
enum class AttentionMode { materialized, recompute, fused };
inline constexpr NameTable<AttentionMode, 3> kAttentionModes{{{AttentionMode::materialized, "materialized"},
                                                              {AttentionMode::recompute, "recompute"},
                                                              {AttentionMode::fused, "fused"}}};

enum class DataKind { fashion_mnist, text, synthetic, seq2seq };
inline constexpr NameTable<DataKind, 4> kDataKinds{{{DataKind::fashion_mnist, "fashion_mnist"},
                                                    {DataKind::text, "text"},
                                                    {DataKind::synthetic, "synthetic"},
                                                    {DataKind::seq2seq, "seq2seq"}}};

// data.clean: the text clean-up before tokenizing (seq2seq data; data/clean.h says what wikihow does).
enum class TextClean { none, wikihow };
inline constexpr NameTable<TextClean, 2> kTextCleans{{{TextClean::none, "none"}, {TextClean::wikihow, "wikihow"}}};

enum class OptimizerKind { sgd, adadelta, adamw };
inline constexpr NameTable<OptimizerKind, 3> kOptimizerKinds{
    {{OptimizerKind::sgd, "sgd"}, {OptimizerKind::adadelta, "adadelta"}, {OptimizerKind::adamw, "adamw"}}};

enum class SchedulerKind { none, step, cosine };
inline constexpr NameTable<SchedulerKind, 3> kSchedulerKinds{
    {{SchedulerKind::none, "none"}, {SchedulerKind::step, "step"}, {SchedulerKind::cosine, "cosine"}}};

// FSDP's sharding strategies by the names PyTorch gives them.
enum class Strategy { full_shard, shard_grad_op, no_shard, hybrid_shard, hybrid_shard_zero2 };
inline constexpr NameTable<Strategy, 5> kStrategies{{{Strategy::full_shard, "FULL_SHARD"},
                                                     {Strategy::shard_grad_op, "SHARD_GRAD_OP"},
                                                     {Strategy::no_shard, "NO_SHARD"},
                                                     {Strategy::hybrid_shard, "HYBRID_SHARD"},
                                                     {Strategy::hybrid_shard_zero2, "HYBRID_SHARD_ZERO2"}}};

enum class WrapPolicy { size_based, transformer_layer, manual };
inline constexpr NameTable<WrapPolicy, 3> kWrapPolicies{{{WrapPolicy::size_based, "size_based"},
                                                         {WrapPolicy::transformer_layer, "transformer_layer"},
                                                         {WrapPolicy::manual, "manual"}}};

enum class BackwardPrefetch { pre, post, none };
inline constexpr NameTable<BackwardPrefetch, 3> kBackwardPrefetches{{{BackwardPrefetch::pre, "BACKWARD_PRE"},
                                                                     {BackwardPrefetch::post, "BACKWARD_POST"},
                                                                     {BackwardPrefetch::none, "none"}}};

enum class CheckpointFormat { consolidated, sharded };
inline constexpr NameTable<CheckpointFormat, 2> kCheckpointFormats{
    {{CheckpointFormat::consolidated, "consolidated"}, {CheckpointFormat::sharded, "sharded"}}};

// MPI-IO transfers of a save.
enum class CheckpointIo { independent, collective };
inline constexpr NameTable<CheckpointIo, 2> kCheckpointIos{
    {{CheckpointIo::independent, "independent"}, {CheckpointIo::collective, "collective"}}};

// HYBRID_SHARD and HYBRID_SHARD_ZERO2: shard groups within a node (or fsdp.hybrid.shard_group_size
// ranks), replicas across them.
constexpr bool is_hybrid(Strategy s) { return s == Strategy::hybrid_shard || s == Strategy::hybrid_shard_zero2; }
// PyTorch's reshard_after_forward: FULL_SHARD and HYBRID_SHARD free a unit's gathered parameters
// after its forward and gather them again for its backward; the ZeRO-2 strategies keep them.
constexpr bool reshards_after_forward(Strategy s) {
  return s != Strategy::shard_grad_op && s != Strategy::hybrid_shard_zero2;
}

// Each enum's name table, by overload: generic code (the checkpoint attributes) converts both ways.
constexpr const auto& name_table(OptimizerKind) { return kOptimizerKinds; }
constexpr const auto& name_table(SchedulerKind) { return kSchedulerKinds; }
constexpr const auto& name_table(Strategy) { return kStrategies; }
constexpr const auto& name_table(WrapPolicy) { return kWrapPolicies; }
constexpr const auto& name_table(CheckpointFormat) { return kCheckpointFormats; }

// The E whose name is `text`, or nothing.
template <class E>
constexpr std::optional<E> parse_enum(std::string_view text) {
  return parse_name(name_table(E{}), text);
}

// Each enum's name, by overload: for messages and tests.
inline std::string_view enum_name(DataKind e) { return name_of(kDataKinds, e); }
inline std::string_view enum_name(TextClean e) { return name_of(kTextCleans, e); }
inline std::string_view enum_name(AttentionMode e) { return name_of(kAttentionModes, e); }
inline std::string_view enum_name(OptimizerKind e) { return name_of(kOptimizerKinds, e); }
inline std::string_view enum_name(SchedulerKind e) { return name_of(kSchedulerKinds, e); }
inline std::string_view enum_name(Strategy e) { return name_of(kStrategies, e); }
inline std::string_view enum_name(WrapPolicy e) { return name_of(kWrapPolicies, e); }
inline std::string_view enum_name(BackwardPrefetch e) { return name_of(kBackwardPrefetches, e); }
inline std::string_view enum_name(CheckpointFormat e) { return name_of(kCheckpointFormats, e); }
inline std::string_view enum_name(CheckpointIo e) { return name_of(kCheckpointIos, e); }

}  // namespace fsdp
