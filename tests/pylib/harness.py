"""A suite that launches fsdp_app many times (tests/ckpt, tests/fault, tests/slurm): a scratch
folder, an empty input file, fsdp_app under mpirun, and the suite's Report."""
import os
import shutil
import sys
import tempfile
import time
import traceback

from pylib import launch
from pylib.report import Report


class Harness(Report):
    def __init__(self, app, prefix, only_env="CKPT_TEST_ONLY"):
        super().__init__()
        self.only_env = only_env
        self.app = os.path.abspath(app)
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        self.cfg = os.path.join(self.tmp, "empty.yaml")
        open(self.cfg, "w").close()

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def command(self, np_, sets, timeout=120, mpirun=True):
        """np_ ranks under mpirun (mpirun=False: np_ must be 1, the app alone)."""
        return launch.app_command(self.app, self.cfg, sets, np_, timeout, use_mpirun=mpirun)

    def run(self, np_, sets, env=None, timeout=120, mpirun=True):
        return launch.run(self.command(np_, sets, timeout, mpirun), env=env, cwd=self.tmp)

    def run_ok(self, np_, sets, **kw):
        r = self.run(np_, sets, **kw)
        if r.rc != 0:
            raise RuntimeError(f"np={np_} exit {r.rc}: {r.tail()}")
        return r

    def case(self, name, fn, *args):
        """Runs one test case; an exception in it is a FAIL line with the reason. The variable
        only_env (CKPT_TEST_ONLY unless the suite names its own) =text runs only the cases whose
        name contains text (when iterating on one)."""
        only = os.environ.get(self.only_env) if self.only_env else None
        if only and only not in name:
            return
        t0 = time.time()
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - any error is this case's failure
            self.check(name, False, f"error: {e}")
            traceback.print_exc(limit=3, file=sys.stdout)
        print(f"      ({name}: {time.time() - t0:.1f} s)", flush=True)

    def finish(self):
        """Prints the counts; removes the scratch folder unless a case failed; exits."""
        self.print_counts()
        if not self.failed:
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            print(f"  files kept in {self.tmp}")
        sys.exit(self.exit_code())
