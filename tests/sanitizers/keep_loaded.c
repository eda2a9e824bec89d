/* LD_PRELOADed by tests/sanitize.sh into every process of the sanitizer suites: dlclose() keeps
 * the library loaded. Why: Open MPI 4.1 dlcloses its MCA plugins (mca_*.so) in MPI_Finalize, and
 * the ~3,300 blocks they allocated in MPI_Init become unreachable at exit. LeakSanitizer then
 * symbolizes each one's stack to match it against tests/sanitizers/lsan.supp, and every frame in
 * an unloaded plugin makes the symbolizer re-read /proc/self/maps: 1.5 s of a failing
 * fsdp_app's 2.6 s (perf: sanitizer internal_read of /proc/self/maps, 26,000 munmaps). With the
 * plugins kept, their blocks stay reachable from the plugins' globals, 20 leaked blocks are left
 * for the suppressions, and the process takes 1.4 s. Open MPI 5's mca_base_component_disable_dlclose
 * does the same; 4.1 (Debian 12) has no such parameter. Nothing in our code calls dlclose on a
 * CPU machine; a leak we make is still unreachable and still reported.
 * Built without the sanitizers (tests/sanitize.sh compiles it with cc): it is preloaded into
 * uninstrumented processes too (python3, mpirun), where it needs no sanitizer runtime. */
#include <dlfcn.h>

int dlclose(void *handle) {
  (void)handle;
  return 0;
}
