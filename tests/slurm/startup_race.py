#!/usr/bin/python3
"""Open MPI's start-up crash on the two-node test cluster, without fsdp-hpc: a 20-line MPI
program (init, node split, a split, two all_reduces) run under `srun --mpi=pmix` on two emulated
nodes x 2 tasks, RUNS times. Not a test suite (it only counts); run by hand:

  /usr/bin/python3 tests/slurm/startup_race.py [RUNS]   (default 300; about 2 s a run)

What it found (2026-11-26, Debian 12: Open MPI 4.1.4, PMIx 4.2.2, Slurm 22.05.8, 2 cores under a
load of about 15): 4 crashes in 300 runs (two clusters side by side, each with its own job ids);
with SLURM_PMIX_FENCE=tree the same crash came 2 times in 200 runs. Every crash is a SIGSEGV at address 0 in MPI_Init: the
main thread, waiting in ompi_mpi_init's modex fence (opal_progress), receives a btl/tcp
fragment from a rank on the other node and calls mca_btl_base_active_message_trigger[0x41]
.cbfunc, which is NULL: 0x41 is ob1's MATCH tag (MCA_BTL_TAG_PML + 1), whose handler ob1
registers only in add_procs, after that fence. So a peer's first MPI message reached a rank
that had not finished MPI_Init. The script reads the tag out of each core file (gdb) and prints
it, so a rerun on other versions says whether the same race is behind a crash. fsdp_app's
hybrid Slurm job dies the same way (the retry in slurm_tests.py's hybrid_case)."""
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import Cluster  # noqa: E402

PROGRAM = r"""
#include <mpi.h>
#include <stdio.h>
int main(int argc, char** argv) {
  int provided, rank, size;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);  /* as fsdp_app */
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm node, sub;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &sub);
  double x = rank, y = 0;
  MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, sub);
  MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("ok %d ranks\n", size);
  MPI_Comm_free(&sub);
  MPI_Comm_free(&node);
  MPI_Finalize();
  return 0;
}
"""


def core_tag(program, core):
    """The active-message tag the crashed rank dispatched, when the crash is the NULL callback
    in btl/tcp's receive path (frame 1 in mca_btl_tcp.so; the fragment's tag at 0x98(%rbp) in
    Debian's 4.1.4 build), else gdb's first frames."""
    out = subprocess.run(["gdb", "-batch", "-ex", "bt 3", "-ex", "x/1bx $rbp+0x98", program, core],
                         capture_output=True, text=True).stdout
    frames = list(dict.fromkeys(l for l in out.splitlines() if l.startswith("#")))  # gdb prints #0 twice
    if frames and frames[0].startswith("#0  0x0000000000000000") and "mca_btl_tcp" in "".join(frames[1:2]):
        return "NULL callback for tag " + out.strip().split()[-1]
    return " | ".join(frames[:3]) or "no backtrace"


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    work = tempfile.mkdtemp(prefix="startup_race_")
    program = os.path.join(work, "startup_race")
    with open(program + ".c", "w") as f:
        f.write(PROGRAM)
    subprocess.run(["mpicc", "-O1", "-g", program + ".c", "-o", program], check=True)
    env_extra = dict(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                     OMPI_MCA_btl_tcp_if_include="lo")  # as slurm_tests.py's CROSS_NODE_ENV
    crashes = 0
    with Cluster(nodes=2) as cl:
        env = cl.env(dict(os.environ, **env_extra))
        for k in range(runs):
            d = os.path.join(work, f"run-{k:04d}")
            os.makedirs(d)
            t0 = time.time()
            r = subprocess.run(["srun", "--mpi=pmix", "--kill-on-bad-exit=1", "-N2", "--ntasks-per-node=2",
                                "-t", "2", program], cwd=d, env=env, capture_output=True, text=True, timeout=300)
            ok = r.returncode == 0 and "ok 4 ranks" in r.stdout
            row = {"run": k, "ok": ok, "rc": r.returncode, "s": round(time.time() - t0, 2)}
            if not ok:
                crashes += 1
                with open(os.path.join(d, "out.txt"), "w") as f:
                    f.write(r.stdout + r.stderr)
                core = os.path.join(d, "core")
                row["why"] = core_tag(program, core) if os.path.exists(core) else (r.stdout + r.stderr)[-300:]
                row["folder"] = d
            print(json.dumps(row), flush=True)
    print(f"startup_race: {runs} runs, {crashes} crashed; folders in {work}")


if __name__ == "__main__":
    main()
