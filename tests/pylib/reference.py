"""The common end of the Hugging Face reference checks (tests/reference/check_t5.py,
check_llama.py): one thread and root allowed for every fsdp_app they start, the venv found once,
one Report case per config, and the last line `TOOL: PASS (N s)` or `TOOL: FAIL: ...` (exit 1)."""
import os
import sys
import time

from pylib.launch import Fail
from pylib.venv import hf_python


def run_configs(tool, report, configs, check_one):
    """check_one(cfg_name, py) -> [failure texts] for each config (raising Fail: one failure);
    exits 1 after the counts when any failed."""
    # One thread everywhere: fsdp_app runs alone (np 1, Open MPI's singleton mode, as root in
    # CI) or under tests/mpirun.sh; the equivalence across world sizes is tests/fsdp's.
    os.environ.update({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                       "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    t0 = time.time()
    try:
        py = hf_python()
    except Fail as e:
        report.check("Hugging Face venv", False, str(e))
        report.print_counts()
        print(f"{tool}: FAIL: {e}")
        sys.exit(1)
    fails = []
    for cfg_name in configs:
        try:
            fails += check_one(cfg_name, py)
        except Fail as e:
            report.check(cfg_name, False, str(e))
            fails.append(f"{cfg_name}: {e}")
    report.print_counts()
    if fails:
        print(f"{tool}: FAIL: {'; '.join(fails)}")
        sys.exit(1)
    print(f"{tool}: PASS ({time.time() - t0:.1f} s)")
