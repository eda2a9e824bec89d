#pragma once
// checkpoint.format and checkpoint.io: how a checkpoint is laid out and written.
#include "tensor/name_table.h"

namespace fsdp {

enum class CheckpointFormat { consolidated, sharded };
inline constexpr NameTable<CheckpointFormat, 2> kCheckpointFormats{
    {{CheckpointFormat::consolidated, "consolidated"}, {CheckpointFormat::sharded, "sharded"}}};

// MPI-IO transfers of a save.
enum class CheckpointIo { independent, collective };
inline constexpr NameTable<CheckpointIo, 2> kCheckpointIos{
    {{CheckpointIo::independent, "independent"}, {CheckpointIo::collective, "collective"}}};

constexpr const auto& name_table(CheckpointFormat) { return kCheckpointFormats; }
constexpr const auto& name_table(CheckpointIo) { return kCheckpointIos; }

}  // namespace fsdp
