#pragma once
// cuBLAS and cuBLASLt are loaded when the first CUDA device runtime starts, not when a program
// does. The two are about 600 MB of shared objects, and loading them cost every process of a
// CUDA build about 0.16 CPU-s (relocations and page faults: `./a.out` 20 times, linked with
// -lcublasLt or not, 3.3 CPU-s vs 0.02): a CPU run, each rank of a large job (reading them from
// a parallel file system), and each of the test suites' hundreds of process starts paid it for
// nothing. The CUDA runtime and NCCL stay linked (3 ms per process together).
//
// cublas_loader.cpp defines each cuBLAS/cuBLASLt function this library calls, with the header's
// own signature (a mismatch does not compile), as a call through a pointer that load_cublas()
// resolved: the callers include <cublas_v2.h>/<cublasLt.h> and call them as before.
#include <string>

namespace fsdp::cuda {

// dlopen()s libcublasLt and libcublas (the sonames of the toolkit this build was compiled
// against: the loader's search, LD_LIBRARY_PATH first, then that toolkit's lib64) and resolves
// every function, once per process. Throws fsdp::Error with one line naming the library or
// symbol that is missing and where it looked. Called by the cuBLAS handles' constructors;
// every forwarding definition calls it too.
void load_cublas();

// "libcublas.so.13 from /usr/local/cuda/lib64/libcublas.so.13, libcublasLt.so.13 from ...":
// where the loaded libraries came from (dladdr), after load_cublas().
std::string cublas_loaded_from();

}  // namespace fsdp::cuda
