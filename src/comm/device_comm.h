#pragma once
// Device buffers on the host-data-plane backends (mpi, ucx): one decorator for all of them, so
// no backend copies device memory itself. make_communicator applies it when CommOptions::runtime
// is a cuda runtime and the backend does not take device buffers natively (nccl does).
//
// A buffer is a device buffer when runtime.is_device_pointer(ptr); host pointers pass straight
// through, untouched and uncopied. In a call that mixes the two, only the device side is handled.
// The Stream of a call is the one whose work produced the inputs and will consume the outputs; a
// null Stream means runtime.compute_stream() (in calls and in Work::wait_on alike).
//
// Which calls go which way is the wrapped communicator's device_path() (comm.h), chosen by the
// backend from comm.device_buffers and what its library says at run time:
//  - device pointers (the library reads and writes device memory itself, e.g. a CUDA-aware MPI):
//    the host first waits for the stream's work so far (an event recorded on it, synchronised
//    with comm.timeout_s), then the wrapped communicator gets the device pointers. Its Work is
//    returned as is: once complete the result is in device memory, so wait_on has nothing more
//    to order. Data movers (all_gather, broadcast) go so with DevicePath::direct_moves,
//    reductions (sum, max, min) with direct_reductions; a device all_gather that is not in place
//    is made so on the stream first (a device-to-device copy into its slot), so no backend
//    copies device memory on the host. Calls that mix host and device buffers, and avg (its
//    division runs on the host), are staged.
//  - staged (every other case): device inputs are copied into pinned host staging memory with
//    copy_async on the call's stream, and the host waits for that copy (comm.timeout_s) before
//    the wrapped collective starts on the host buffers. The returned Work copies the result back
//    when the collective has completed:
//      wait()       = the wrapped wait, then the host->device copy on the call's stream, and the
//                     host waits for it: afterwards the device buffer holds the result.
//      wait_on(s)   = the wrapped wait (the host blocks for the collective itself: it runs on the
//                     host), then the host->device copy enqueued on s; the host does not wait
//                     for the copy. Work later enqueued on s sees the result.
//      test()       = true once the wrapped collective is done. The host->device copy is issued
//                     by the first wait() or wait_on(), not by test(): after test() is true, call
//                     one of them before reading the result on the device.
//    Work enqueued on the call's stream after the call but before wait/wait_on does not see the
//    result yet (the copy joins the stream at the wait), unlike a native device backend.
//    In-place forms (all_gather with in == out + rank*count, all_reduce with in == out) run in
//    place in the staging buffer; a device all_gather or all_reduce that is not in place is
//    staged in place too (the input copied to its slot of the output staging), so every
//    collective moves one device->host and at most one host->device copy (broadcast: one
//    device->host on the root, one host->device elsewhere).
//
// Staging memory is pinned (runtime.allocate_pinned), cached per communicator and grown by
// powers of two, so steady-state collectives allocate nothing. A staging buffer belongs to one
// Work until the host->device copy of its result was issued, and is reused only after that
// copy's event completed (the host waits for it if it has not): a Work's result stays correct
// when the caller uses wait_on and starts the next collective at once. A staging buffer whose
// collective timed out and never completed is abandoned (neither reused nor freed: the library
// may still write to it). Splits get staging caches of their own.
//
// The runtime must outlive the communicator and every Work it returned.
#include <memory>

#include "comm/comm.h"
#include "tensor/device.h"

namespace fsdp {

// Returns a Communicator that accepts device buffers of `runtime` on `host`'s backend. Its
// backend() is host's (messages keep naming "mpi"/"ucx"); its splits are wrapped the same way.
std::unique_ptr<Communicator> wrap_for_device(std::unique_ptr<Communicator> host, DeviceRuntime& runtime,
                                              DevicePath path);

}  // namespace fsdp
