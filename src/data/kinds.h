#pragma once
// data.kind and data.clean: what data/ loads and how it cleans text.
#include "tensor/name_table.h"

namespace fsdp {

enum class DataKind { fashion_mnist, text, synthetic, seq2seq, causal_lm };
inline constexpr NameTable<DataKind, 5> kDataKinds{{{DataKind::fashion_mnist, "fashion_mnist"},
                                                    {DataKind::text, "text"},
                                                    {DataKind::synthetic, "synthetic"},
                                                    {DataKind::seq2seq, "seq2seq"},
                                                    {DataKind::causal_lm, "causal_lm"}}};

// data.clean: the text clean-up before tokenizing (seq2seq data; data/clean.h says what wikihow does).
enum class TextClean { none, wikihow };
inline constexpr NameTable<TextClean, 2> kTextCleans{{{TextClean::none, "none"}, {TextClean::wikihow, "wikihow"}}};

constexpr const auto& name_table(DataKind) { return kDataKinds; }
constexpr const auto& name_table(TextClean) { return kTextCleans; }

}  // namespace fsdp
