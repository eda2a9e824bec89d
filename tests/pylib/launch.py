"""Launching fsdp_app and friends from the Python suites (standard library only).

ENV is the environment every launch gets: Open MPI may run as root and oversubscribe the
machine's cores (the suites start more ranks than CI has), one BLAS/OpenMP thread per rank."""
import os
import subprocess
import sys
import time

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
# A fault of the checkpoint suites must never leak into another launch by inheritance.
ENV.pop("FSDP_TEST_KILL_RANK_DURING_SAVE", None)


class Fail(Exception):
    """One line naming what failed (a step of a suite that cannot go on)."""


# mpirun oversubscribed and unbound (more ranks than cores); then -np N, or an MPMD list.
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]


def mpirun(np_):
    """mpirun with np_ ranks."""
    return MPIRUN + ["-np", str(np_)]


def set_args(sets):
    """["--set", "k=v", ...] for fsdp_app's command line."""
    out = []
    for s in sets:
        out += ["--set", s]
    return out


def app_command(app, cfg, sets, np_=1, timeout=None, use_mpirun=True, kill_after=10):
    """fsdp_app CFG --set ... under mpirun -np np_ (use_mpirun False: np_ must be 1, the app
    alone), inside `timeout` when timeout is given (SIGKILL kill_after seconds after its SIGTERM;
    None: no SIGKILL)."""
    cmd = []
    if timeout:
        cmd = ["timeout"] + (["-k", str(kill_after)] if kill_after is not None else []) + [str(timeout)]
    if use_mpirun:
        cmd += mpirun(np_)
    elif np_ != 1:
        raise ValueError("without mpirun only one rank")
    return cmd + [app, cfg] + set_args(sets)


def what(cmd):
    """The program a command line runs: the script for `python SCRIPT ...`, past timeout/mpirun."""
    i = 0
    if os.path.basename(cmd[0]) == "timeout":
        i = 1
        while i < len(cmd) and cmd[i].startswith("-"):
            i += 2 if cmd[i] in ("-k", "-s") else 1
        i += 1  # the duration
    if i < len(cmd) and os.path.basename(cmd[i]) == "mpirun":
        i += 1
        while i < len(cmd) and cmd[i].startswith("-"):
            i += 1 if cmd[i] == "--oversubscribe" else 2
    prog = os.path.basename(cmd[i]) if i < len(cmd) else os.path.basename(cmd[0])
    return os.path.basename(cmd[i + 1]) if prog.startswith("python") and i + 1 < len(cmd) else prog


def run_logged(cmd, log, timeout=300, stdin=None, env=None, prefixes=("fsdp_app:",)):
    """Runs cmd with stdout and stderr in the file `log`; returns its wall seconds. A non-zero exit
    prints the log's tail on stderr and raises Fail naming the program, the exit status and its
    last line (the last one starting with one of `prefixes` when there is one)."""
    t0 = time.time()
    with open(log, "w") as f:
        try:
            r = subprocess.run(cmd, stdin=stdin, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise Fail(f"{what(cmd)} ran past {timeout} s (log {log})") from None
    if r.returncode != 0:
        text = open(log, errors="replace").read()
        sys.stderr.write(text[-4000:])
        lines = [line for line in text.splitlines() if line.strip()]
        ours = [line for line in lines if line.startswith(tuple(prefixes))]
        last = (ours or lines or ["(no output)"])[-1][:300]
        raise Fail(f"{what(cmd)} exited {r.returncode}: {last} (log {log})")
    return time.time() - t0


class Result:
    """A finished launch: exit status, output, seconds, the command."""

    def __init__(self, rc, out, err, seconds, cmd):
        self.rc, self.out, self.err, self.seconds, self.cmd = rc, out, err, seconds, cmd

    def tail(self, n=600):
        ours = self.ours()
        return "\n".join(ours)[-n:] if ours else (self.err.strip() or self.out.strip())[-n:]

    def ours(self):
        """stderr lines written by fsdp_app itself (mpirun adds its own banner on failures)."""
        return [l for l in self.err.splitlines() if l.startswith("fsdp_app:")]


def run(cmd, env=None, cwd=None):
    """Runs cmd (ENV plus env), its output captured; returns a Result."""
    t0 = time.time()
    p = subprocess.run(cmd, env=dict(ENV, **(env or {})), capture_output=True, text=True, cwd=cwd)
    return Result(p.returncode, p.stdout, p.stderr, time.time() - t0, cmd)
