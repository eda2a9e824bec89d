#!/usr/bin/python3
"""Fault injection, end to end through fsdp_app under mpirun (np=3 on a machine with fewer cores).

Every case injects one fault into a running job and checks the end-to-end outcome:
  - the job ends by itself (mpirun exits non-zero) within comm.timeout_s + SLACK_S of the fault,
  - its output holds one line naming what happened (asserted on the exact text),
  - with checkpointing on: the newest complete checkpoint passes `fsdp_ckpt verify`, and
    checkpoint.resume=auto resumes from exactly it (a partial .tmp is never taken for one),
  - no process of this launch is left behind (pgrep -x fsdp_app / mpirun / orted / prted,
    narrowed to this launch by a marker variable in the processes' environment).

  kill_collective  rank 1 SIGKILLed mid-training (after step 5 of 40; the ranks spend their time
                   in the step's collectives): mpirun names the rank and the signal
  kill_save        rank 1 SIGKILLs itself in the middle of the step-4 save
                   (FSDP_TEST_KILL_RANK_DURING_SAVE=1:4): ckpt_2 stays good, the .tmp is skipped
  kill_startup     rank 1 SIGKILLed during start-up: once as soon as its process exists (before
                   or inside MPI_Init, i.e. before the communicator exists) and once while it
                   reads the Fashion-MNIST files (an open file under the dataset folder).
                   Killed before its launch completed, Open MPI prints only its abort banner and
                   exits 137 (no "noticed" line naming the rank): the early case accepts that form
  skip_collective  rank 1 leaves out the loss all_reduce of step 5 and goes on
                   (FSDP_TEST_FAULT=skip_collective:1:5): the peers wait for it and it waits for
                   them in its next collective; comm.timeout_s ends the job (not earlier: nothing
                   else can) and the line names the collective. MPI and UCX backends
  disk_full        checkpoint.dir on a private 700 KiB tmpfs (unshare -m: the mount never shows
                   in the host's mount table): ckpt_2 (450 KB) fits, the step-4 save does not:
                   "No space left on device" with the file named, the .tmp removed
  unreadable_data  Fashion-MNIST copied with one file at mode 000, rank 1 alone started without
                   CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH (setpriv; root would read it otherwise):
                   that rank's open fails with EACCES and the job ends with the path named

usage: fault_tests.py FSDP_APP FSDP_CKPT      (Debian's /usr/bin/python3 with h5py, numpy; root)
FAULT_TEST_ONLY=text runs only the cases whose name contains text. Prints one PASS/FAIL line per
check, a SKIP line per case this machine cannot run, and the counts (pylib/report.py); exits
non-zero on any failure (77 when everything was skipped)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: pylib
from pylib.ckpt import ckpt_files, ckpt_name, complete_ckpts  # noqa: E402
from pylib.configs import MODELS  # noqa: E402
from pylib.harness import Harness  # noqa: E402
from pylib.launch import ENV, MPIRUN, mpirun as mpirun_np, set_args  # noqa: E402

H = Harness(sys.argv[1], "fsdp_fault_test_", only_env="FAULT_TEST_ONLY")
CKPT_TOOL = os.path.abspath(sys.argv[2])
NP = 3
FAULT_RANK = 1
TIMEOUT_S = 10   # comm.timeout_s of every launch
SLACK_S = 5      # what ending the job may take beyond comm.timeout_s (abort, mpirun teardown)
HARD_S = 60      # a launch still running this long after its fault is killed by the test: a FAIL
FASHION = "/usr/share/datasets/fashion-mnist"
MARK = "FSDP_FAULT_TEST_RUN"  # in every process of a launch: names the launch for the leftover check
# The ranks of the transformer launches: the tiny LM of tests/ckpt on synthetic tokens, 4 steps
# per epoch, a 450 KB consolidated checkpoint.
LM = MODELS["transformer"] + ["output.log_every=1", f"comm.timeout_s={TIMEOUT_S}"]
CNN_REAL = ["model.kind=mnist_cnn", "data.kind=fashion_mnist", "train.steps=4", "train.eval_every=never",
            "train.threads=1", "output.log_every=1", f"comm.timeout_s={TIMEOUT_S}"]
NO_DAC = ["setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]

_running = []  # every Launch not yet ended: killed if this script is stopped


def _stop_all(*_):
    for launch in list(_running):
        launch.kill()
    sys.exit(143)


signal.signal(signal.SIGTERM, _stop_all)


def mpirun(np_, sets, rank_prefix=None):
    """mpirun with np_ ranks of fsdp_app; rank_prefix: a command put in front of FAULT_RANK's only
    (an MPMD launch, so the ranks keep their order)."""
    app = [H.app, H.cfg] + set_args(sets)
    if rank_prefix is None:
        return mpirun_np(np_) + app
    cmd = list(MPIRUN)
    groups = []
    for r in range(np_):
        groups += ([":"] if r else []) + ["-np", "1"] + (rank_prefix if r == FAULT_RANK else []) + app
    return cmd + groups


class Launch:
    """One command (mpirun, or a shell around it) in a session of its own; stdout and stderr read
    line by line, each line with the time it arrived."""

    def __init__(self, name, cmd, env=None):
        self.name, self.cmd = name, cmd
        self.marker = os.path.join(H.tmp, name)
        self.lines = []  # (time, stream, text)
        self.lock = threading.Lock()
        self.t_start = time.time()
        self.p = subprocess.Popen(cmd, env=dict(ENV, **{MARK: self.marker}, **(env or {})), cwd=H.tmp,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                                  start_new_session=True)
        _running.append(self)
        self.readers = [threading.Thread(target=self._read, args=(s, tag), daemon=True)
                        for s, tag in ((self.p.stdout, "out"), (self.p.stderr, "err"))]
        for t in self.readers:
            t.start()
        self.t_end = None
        self.hung = False

    def _read(self, stream, tag):
        for line in stream:
            with self.lock:
                self.lines.append((time.time(), tag, line.rstrip("\n")))

    def text(self):
        with self.lock:
            return "\n".join(l for _, _, l in self.lines)

    def line_time(self, pattern):
        """(time, line) of the first line matching pattern, or None."""
        with self.lock:
            for t, _, l in self.lines:
                if re.search(pattern, l):
                    return t, l
        return None

    def wait_line(self, pattern, timeout=60):
        t0 = time.time()
        while time.time() - t0 < timeout:
            hit = self.line_time(pattern)
            if hit:
                return hit
            if self.p.poll() is not None:
                time.sleep(0.2)  # the readers may still hold the last lines
                hit = self.line_time(pattern)
                if hit:
                    return hit
                raise RuntimeError(f"{self.name}: ended (exit {self.p.returncode}) before a line matching "
                                   f"{pattern!r}: {self.text()[-800:]}")
            time.sleep(0.002)
        raise RuntimeError(f"{self.name}: no line matching {pattern!r} in {timeout} s")

    def rank_pid(self, rank, timeout=30):
        """The pid of fsdp_app rank `rank` of this launch, found by name, marker and rank."""
        want = {f"{MARK}={self.marker}".encode(), f"OMPI_COMM_WORLD_RANK={rank}".encode()}
        t0 = time.time()
        while time.time() - t0 < timeout:
            for pid in pgrep("fsdp_app"):
                if want <= environ(pid):
                    return pid
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.name}: ended before rank {rank} was seen: {self.text()[-800:]}")
            time.sleep(0.001)
        raise RuntimeError(f"{self.name}: no fsdp_app rank {rank} in {timeout} s")

    def wait(self, t_fault):
        """Until the command ends by itself; past HARD_S after the fault it is killed (hung)."""
        try:
            self.p.wait(timeout=max(1.0, t_fault + HARD_S - time.time()))
        except subprocess.TimeoutExpired:
            self.hung = True
            self.kill()
            self.p.wait()
        self.t_end = time.time()
        for t in self.readers:
            t.join(5)
        if self in _running:
            _running.remove(self)
        return self.p.returncode

    def kill(self):
        """SIGKILL to this launch's session (mpirun and what it started) and its marked processes."""
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for _, pid in marked_processes(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def pgrep(name):
    p = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True)
    return [int(x) for x in p.stdout.split()]


def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return set(f.read().split(b"\0"))
    except OSError:
        return set()


def marked_processes(marker):
    """[(name, pid)] of live fsdp_app/mpirun/orted/prted processes carrying this launch's marker."""
    tag = f"{MARK}={marker}".encode()
    return [(name, pid) for name in ("fsdp_app", "mpirun", "orted", "prted") for pid in pgrep(name)
            if tag in environ(pid)]


# ---------------------------------------------------------------------------------------------
# The checks every case makes

def check_end(name, launch, rc, t_fault, what, lo=None):
    """Ended non-zero by itself within comm.timeout_s + SLACK_S of the fault (lo: not before)."""
    took = launch.t_end - t_fault
    limit = TIMEOUT_S + SLACK_S
    ok = rc != 0 and not launch.hung and took <= limit and (lo is None or took >= lo)
    H.check(f"{name}: the job ends by itself, non-zero, within comm.timeout_s + {SLACK_S} s of the fault", ok,
            f"exit {rc} {took:.2f} s after {what}" + (" (HUNG: killed by the test)" if launch.hung else "") +
            (f" (expected at least {lo} s: the timeout must be what ends it)" if lo is not None and took < lo else "") +
            f"; limit {limit} s")
    return took


def check_message(name, launch, pattern, what):
    """The output holds a line matching `pattern` (a regular expression for the exact text)."""
    hit = launch.line_time(pattern)
    ours = [l for l in launch.text().splitlines() if l.startswith("fsdp_app:") or "mpirun noticed" in l]
    H.check(f"{name}: the output names {what}", hit is not None,
            f"line: {hit[1]!r}" if hit else f"no line matching {pattern!r}; fsdp_app/mpirun lines: {ours[:6]} "
            f"output tail: {launch.text()[-600:]!r}")
    return hit[1] if hit else None


def check_no_leftovers(name, launch):
    left = marked_processes(launch.marker)
    if left:  # give a dying process a moment, then record and end it (never leave one behind)
        time.sleep(2)
        left = marked_processes(launch.marker)
        launch.kill()
    H.check(f"{name}: no process of this launch is left", not left,
            "none of fsdp_app/mpirun/orted/prted carries this launch's marker" if not left else f"left: {left}")


def check_checkpoints(name, ckdir, want_newest, want_tmp):
    """The newest complete checkpoint is `want_newest`, passes fsdp_ckpt verify, and resume=auto
    (one more step, np=3) resumes from exactly it. want_tmp: a partial .tmp must (True) / must not
    (False) be in the folder, or (a file name) may be, that one alone: a kill that lands while the
    ranks are already in the next save leaves that save's .tmp, and only it."""
    files = ckpt_files(ckdir)
    done = complete_ckpts(ckdir)
    tmps = [f for f in files if f.endswith(".tmp")]
    newest = done[-1] if done else None
    if isinstance(want_tmp, str):
        tmp_ok, tmp_rule = tmps in ([], [want_tmp]), f"allowed: {want_tmp} alone"
    else:
        tmp_ok, tmp_rule = bool(tmps) == want_tmp, "expected" if want_tmp else "not expected"
    v = subprocess.run([CKPT_TOOL, "verify", os.path.join(ckdir, newest)] if newest else ["false"],
                       capture_output=True, text=True, env=ENV)
    verify_out = (v.stdout + v.stderr).strip().splitlines()
    H.check(f"{name}: the last good checkpoint is intact", newest == want_newest and v.returncode == 0 and
            v.stdout.startswith("OK:") and tmp_ok,
            f"folder {files}; newest complete {newest} (expected {want_newest}); fsdp_ckpt verify: exit "
            f"{v.returncode} {verify_out[-1] if verify_out else ''!r}; .tmp {tmp_rule}")
    if not newest:
        return
    step = int(newest[5:13])
    r = H.run(NP, LM + ["train.steps=40", f"checkpoint.dir={ckdir}", "checkpoint.resume=auto",
                        "train.stop_after_steps=1"], timeout=120)
    at = re.search(r"checkpoint: resumed from (\S+) at step (\d+)", r.out)
    want = (os.path.join(ckdir, newest), str(step))
    H.check(f"{name}: checkpoint.resume=auto resumes from it, not from a partial file", r.rc == 0 and at is not None
            and at.groups() == want, f"exit {r.rc}; {at.group(0) if at else 'no resume line: ' + r.tail(300)!r}")


def last_saved(launch):
    """The step of the last `checkpoint: step K saved` line, or None."""
    steps = re.findall(r"^checkpoint: step (\d+) saved", launch.text(), re.M)
    return int(steps[-1]) if steps else None


# ---------------------------------------------------------------------------------------------
# The cases

def kill_collective_case():
    name, d = "kill_collective", H.path("kill_collective")
    ck = os.path.join(d, "ck")
    L = Launch(name, mpirun(NP, LM + ["train.steps=40", f"checkpoint.dir={ck}", "checkpoint.every_steps=2"]))
    L.wait_line(r"^step 5/40 ")
    pid = L.rank_pid(FAULT_RANK)
    os.kill(pid, signal.SIGKILL)
    t_fault = time.time()
    rc = L.wait(t_fault)
    check_end(name, L, rc, t_fault, f"SIGKILL to rank {FAULT_RANK} (pid {pid}) after step 5")
    check_message(name, L, rf"^mpirun noticed that process rank {FAULT_RANK} with PID \d+ on node \S+ exited on "
                           r"signal 9 \(Killed\)\.$", "the killed rank and the signal")
    check_no_leftovers(name, L)
    saved = last_saved(L)
    # The step-5 line reaches us through mpirun's pipe; by the time the SIGKILL lands the ranks may
    # be in the step-6 save (every 2 steps), which then stays a .tmp: allowed, that one only.
    check_checkpoints(name, ck, ckpt_name(saved) if saved else None,
                      ckpt_name((saved or 0) + 2) + ".tmp")


def kill_save_case():
    name, d = "kill_save", H.path("kill_save")
    ck = os.path.join(d, "ck")
    L = Launch(name, mpirun(NP, LM + ["train.steps=40", f"checkpoint.dir={ck}", "checkpoint.every_steps=2"]),
               env={"FSDP_TEST_KILL_RANK_DURING_SAVE": f"{FAULT_RANK}:4"})
    t_fault, _ = L.wait_line(r"^step 4/40 ")  # the save of step 4 starts right after this line
    rc = L.wait(t_fault)
    check_end(name, L, rc, t_fault, "the step-4 line (the save with the kill follows it)")
    check_message(name, L, rf"^mpirun noticed that process rank {FAULT_RANK} with PID \d+ on node \S+ exited on "
                           r"signal 9 \(Killed\)\.$", "the killed rank and the signal")
    check_no_leftovers(name, L)
    # A killed save cannot clean up: its .tmp stays, and resume=auto must not take it.
    check_checkpoints(name, ck, ckpt_name(2), True)


def kill_startup_case(when):
    name = f"kill_startup_{when}"
    if not os.path.isdir(FASHION):
        H.skip(name, f"{FASHION} is missing (Debian package dataset-fashion-mnist)")
        return
    L = Launch(name, mpirun(NP, CNN_REAL))
    pid = L.rank_pid(FAULT_RANK)
    if when == "data":
        # While rank 1 reads the dataset: one of its descriptors is a file of the dataset folder.
        t0 = time.time()
        seen = None
        while seen is None and time.time() - t0 < 60:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                break  # gone: the kill below finds nothing, and the checks say so
            for fd in fds:
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue  # closed between the listing and now
                if target.startswith(FASHION + "/"):
                    seen = target
                    break
            if seen is None:
                time.sleep(0.001)
        if seen is None:
            raise RuntimeError(f"rank {FAULT_RANK} (pid {pid}) never had a Fashion-MNIST file open")
        what = f"SIGKILL to rank {FAULT_RANK} (pid {pid}) while it had {os.path.basename(seen)} open"
    else:
        what = f"SIGKILL to rank {FAULT_RANK} (pid {pid}) {(time.time() - L.t_start) * 1000:.0f} ms after mpirun started"
    os.kill(pid, signal.SIGKILL)
    t_fault = time.time()
    rc = L.wait(t_fault)
    check_end(name, L, rc, t_fault, what)
    noticed = rf"^mpirun noticed that process rank {FAULT_RANK} with PID \d+ on node \S+ exited on signal 9 \(Killed\)\.$"
    if when == "early" and L.line_time(noticed) is None:
        # Open MPI 4.1 prints no "noticed" line for a process killed before its launch completed
        # (seen on CI at 52 ms; reproduced with `mpirun -np 3 sleep 5` and an immediate kill): only
        # the abort banner, and mpirun's exit status carries the signal (128 + 9). Nothing of ours
        # runs in that window, so what mpirun says is all there is; assert exactly that.
        hit = L.line_time(r"^a non-zero exit code\. Per user-direction, the job has been aborted\.$")
        H.check(f"{name}: the output names the signal (Open MPI's pre-launch form: abort banner, mpirun exit 137)",
                hit is not None and rc == 128 + signal.SIGKILL,
                f"banner {hit[1]!r}, mpirun exit {rc}" if hit else f"no banner; output tail {L.text()[-600:]!r}")
    else:
        check_message(name, L, noticed, "the killed rank and the signal")
    check_no_leftovers(name, L)


def skip_collective_case(backend):
    name = f"skip_collective_{backend}"
    d = H.path(name)
    ck = os.path.join(d, "ck")
    L = Launch(name, mpirun(NP, LM + ["train.steps=40", f"checkpoint.dir={ck}", "checkpoint.every_steps=2",
                                      f"comm.backend={backend}"]),
               env={"FSDP_TEST_FAULT": f"skip_collective:{FAULT_RANK}:5"})
    try:
        t_fault, _ = L.wait_line(rf"^fsdp_app: rank {FAULT_RANK}: FSDP_TEST_FAULT: skipping the loss all_reduce of "
                                 r"step 5$")
    except RuntimeError:
        if "is not built in this binary" in L.text():
            L.wait(time.time())
            H.skip(name, f"comm.backend {backend} is not built")
            return
        raise
    rc = L.wait(t_fault)
    check_end(name, L, rc, t_fault, f"rank {FAULT_RANK} skipped the step-5 loss all_reduce", lo=TIMEOUT_S - 1)
    # Whichever side's deadline passes first ends the job: the peers in the skipped all_reduce, or
    # the skipping rank in its next collective (a polled wait's CommTimeout or the MPI watchdog).
    # An FSDP engine's collective also names its unit and phase ("all_gather of unit root (forward)").
    line = check_message(name, L, rf"^fsdp_app: rank \d+: {backend} (all_reduce|all_gather|reduce_scatter|broadcast)"
                                  r"( of [^#]+)? #\d+ "
                                  rf"\(count \d+, \w+\) did not complete within comm.timeout_s = {TIMEOUT_S} s "
                                  r"\(a rank may have failed(, hung)? or skipped this collective\)",
                         "the collective that timed out and comm.timeout_s")
    if line:
        who = int(re.match(r"fsdp_app: rank (\d+)", line).group(1))
        abort = L.line_time(r"^MPI_ABORT was invoked")
        print(f"      timed out first: rank {who} ({'the skipping rank' if who == FAULT_RANK else 'a peer'}), its line "
              f"{L.line_time(re.escape(line))[0] - t_fault:.2f} s after the fault, mpirun's abort banner "
              f"{abort[0] - t_fault if abort else float('nan'):.2f} s, mpirun's exit {L.t_end - t_fault:.2f} s",
              flush=True)
    H.check(f"{name}: no step after the skipped one completed", not re.search(r"^step 5/40 ", L.text(), re.M),
            "the peers never got past the step-5 all_reduce" if not re.search(r"^step 5/40 ", L.text(), re.M)
            else "step 5 was logged: the skip went unnoticed")
    check_no_leftovers(name, L)
    check_checkpoints(name, ck, ckpt_name(4), False)


def disk_full_case():
    name, d = "disk_full", H.path("disk_full")
    ck, copy = os.path.join(d, "ck"), os.path.join(d, "ck_copy")
    os.makedirs(ck)
    run = " ".join(f"'{a}'" for a in mpirun(NP, LM + ["train.steps=40", f"checkpoint.dir={ck}",
                                                      "checkpoint.every_steps=2"]))
    # A private mount namespace: the tmpfs exists only for this shell and what it starts, and goes
    # with it. The folder's state is copied out before the namespace ends, for the checks below.
    script = (f"set -u; mount -t tmpfs -o size=700k fault_test_tmpfs '{ck}' || exit 99; {run}; rc=$?; "
              f"echo \"FAULT_TEST: mpirun exit $rc\"; cp -a '{ck}' '{copy}'; exit $rc")
    L = Launch(name, ["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    t_fault, _ = L.wait_line(r"^step 4/40 ")  # the save of step 4, which runs out of space, follows
    rc = L.wait(t_fault)
    end = L.line_time(r"^FAULT_TEST: mpirun exit \d+$")
    if end:
        L.t_end = end[0]  # mpirun's end, not the copy's
    check_end(name, L, rc if rc != 99 else 0, t_fault, "the step-4 line (the save that fills the disk follows it)")
    check_message(name, L, rf"^fsdp_app: rank \d+: checkpoint: cannot write /\S+ to "
                           rf"{re.escape(ck)}/{ckpt_name(4)}\.tmp \(No space left on device\)",
                  "the file being written and 'No space left on device'")
    check_no_leftovers(name, L)
    # Back on the host the folder is empty again: nothing of the tmpfs leaked into its mount table.
    with open("/proc/self/mounts") as f:
        leaked = [l for l in f if "fault_test_tmpfs" in l]
    H.check(f"{name}: the tmpfs stayed private", not leaked and not os.listdir(ck), f"host mounts: {leaked}; "
            f"{ck} on the host holds {os.listdir(ck)}")
    check_checkpoints(name, copy, ckpt_name(2), False)


def unreadable_data_case():
    name, d = "unreadable_data", H.path("unreadable_data")
    if not os.path.isdir(FASHION):
        H.skip(name, f"{FASHION} is missing (Debian package dataset-fashion-mnist)")
        return
    data = os.path.join(d, "fashion-mnist")
    shutil.copytree(FASHION, data)
    bad = os.path.join(data, "train-images-idx3-ubyte.gz")
    os.chmod(bad, 0)
    L = Launch(name, mpirun(NP, CNN_REAL + [f"data.path={data}"], rank_prefix=NO_DAC))
    t_fault = L.t_start  # the data load is the first thing every rank does: the fault is at most this late
    rc = L.wait(t_fault)
    check_end(name, L, rc, t_fault, "mpirun started (rank 1 fails on its first read)")
    check_message(name, L, rf"^fsdp_app: Fashion-MNIST: {re.escape(bad)}: cannot open: Permission denied "
                           rf"\(on rank {FAULT_RANK}\)$", "the unreadable path, the reason and the rank")
    check_no_leftovers(name, L)
    os.chmod(bad, 0o644)


def main():
    if os.geteuid() != 0:
        H.skip("fault injection", "the fault tests need root (unshare -m, mount, setpriv)")
        H.finish()
    print(f"fault injection: np={NP}, comm.timeout_s={TIMEOUT_S}, slack {SLACK_S} s", flush=True)
    H.case("kill_collective", kill_collective_case)
    H.case("kill_save", kill_save_case)
    H.case("kill_startup_early", kill_startup_case, "early")
    H.case("kill_startup_data", kill_startup_case, "data")
    H.case("skip_collective_mpi", skip_collective_case, "mpi")
    H.case("skip_collective_ucx", skip_collective_case, "ucx")
    H.case("disk_full", disk_full_case)
    H.case("unreadable_data", unreadable_data_case)
    H.finish()


if __name__ == "__main__":
    try:
        main()
    finally:
        for launch in list(_running):
            launch.kill()
