#pragma once
// comm.device_buffers: how device buffers reach a backend whose library may or may not read
// device memory (mpi, ucx; nccl always takes them). auto: device pointers where the library says
// it reads them (a CUDA-aware Open MPI, a UCX with CUDA transports), pinned host staging
// otherwise; staged: always staging (an A/B, or a library whose CUDA support misbehaves); direct:
// device pointers even where the library cannot be asked (Cray MPICH, MVAPICH2-GDR: the user
// vouches for it). Chosen at run time, never at build time (comm/device_comm.h).
#include <cstdint>

#include "tensor/name_table.h"

namespace fsdp {

enum class DeviceBuffers : uint8_t { automatic, staged, direct };
inline constexpr NameTable<DeviceBuffers, 3> kDeviceBuffers{
    {{DeviceBuffers::automatic, "auto"}, {DeviceBuffers::staged, "staged"}, {DeviceBuffers::direct, "direct"}}};
constexpr const auto& name_table(DeviceBuffers) { return kDeviceBuffers; }

}  // namespace fsdp
