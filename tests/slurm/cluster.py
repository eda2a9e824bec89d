#!/usr/bin/python3
"""A private Slurm cluster on localhost, for tests: its own munged, slurmctld and one or two
slurmd, each with its own config, state, spool, log and pid files under one temporary folder.
Installs nothing (jobs/install-deps.sh installs slurm-wlm and munge) and touches no system-wide
Slurm or munge: its own ports, its own munge key and socket, no systemd.

  cluster.py start [--nodes 1|2] [--cpus 8]   starts one, prints `export SLURM_CONF=...` and
                                              the folder (stop it with that folder)
  cluster.py stop DIR                         stops what `start` started there, removes DIR

The jobs it runs need SLURM_CONF (Cluster.env() gives it); `eval "$(cluster.py start)"` sets it
in a shell. From Python: `with Cluster(nodes=2) as c: c.sbatch(...)`.

How it is built (Debian 12, Slurm 22.05, running as root):
- munged runs as root with a key made by mungekey, key and socket in DIR/munge. DIR and
  DIR/munge are 0755: munged refuses a key under a group- or world-writable folder ("Keyfile is
  insecure") and a socket whose folders others cannot enter ("Socket is inaccessible: execute
  permissions for all required"), which mkdtemp's 0700 would be. slurm.conf's AuthInfo points
  every Slurm program, clients included, at that socket.
- Root: nothing here refuses it. munged, slurmctld (SlurmUser = whoever starts it, so no `slurm`
  user has to own the state folder) and slurmd run as root, and so do the jobs (DisableRootJobs
  defaults to NO); what does refuse root is OpenMPI's mpirun, which the job scripts allow with
  OMPI_ALLOW_RUN_AS_ROOT*.
- Quick turnaround for tests: AuthInfo cred_expire=10 (a requeued job waits that long before it
  may start again, 120 s by default), sched_interval=1 (the main scheduling loop, 60 s by
  default, is what starts such a job), batch_sched_delay=0, KillWait=5.
- slurmd -N n1 [-N n2]: one slurmd per emulated node, NodeAddr=127.0.0.1 with a port each;
  SlurmdSpoolDir/PidFile/LogFile use %n so one slurm.conf serves every node. Each slurmd reads
  its own copy of the folder (slurm.conf identical, mpi.conf not): PMIxCliTmpDirBase differs
  per node, or the two nodes' PMIx servers of one step would share a client folder.
- CPUs=8 with SlurmdParameters=config_overrides, so 8-task jobs start on a 2-core machine.
- Processes are started in the foreground (-D/-F) as children of this script, in their own
  session; their pids go to DIR/pids/*.pid. From Python they also get SIGTERM when the script
  dies (PR_SET_PDEATHSIG), so a killed test leaves no daemon behind. stop() cancels the jobs
  still there, stops those pids (checking /proc/PID/cmdline first, so a reused pid is never
  hit), then any process whose environment carries FSDP_SLURM_CLUSTER=DIR (slurmstepd and job
  tasks that outlived their daemon), and removes DIR.
- Each slurmd runs in its own UTS namespace (unshare --uts) with the node's name as hostname
  (NodeHostname=n1, n2, ...): its job steps and tasks inherit it, so Open MPI tells the emulated
  nodes apart as it tells real ones apart. Before, both nodes had the machine's hostname, and
  cross-node jobs needed OMPI_MCA_btl=self,tcp: Open MPI names node-local resources (its
  session directory /tmp/ompi.HOST.UID/..., the vader BTL's shared-memory segments) after the
  hostname, so ranks on the two "nodes" met in the same segments (SIGSEGV in mca_btl_vader
  during MPI_Comm_split_type). Now vader carries traffic within a node and TCP (loopback) across
  them, as on a cluster.
- FirstJobId is random per cluster (1,000 to 60,000,000), so two clusters on one machine (two
  test runs side by side) never run jobs with the same id at the same time. Open MPI names a
  job's shared-memory segments after a hash of its PMIx namespace, slurm.pmix.JOBID.STEP, and
  the node name: two clusters that both start at job 1 gave their jobs the same /dev/shm
  segment files on n1 and n2, and the ranks of the two jobs read each other's messages (seen
  2026-11-26: SIGSEGV in mca_btl_vader_poll_handle_frag on a pointer from another process, or a
  hang, each time two clusters ran the same job id at once)."""
import argparse
import ctypes
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SLURM_PROGRAMS = ["munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo"]
MARK = "FSDP_SLURM_CLUSTER"


def free_ports(n):
    """n distinct TCP ports free on 127.0.0.1 now (the kernel's choice: no clash with a system
    Slurm on 6817/6818 or with another test cluster)."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def missing_programs():
    return [p for p in SLURM_PROGRAMS if not shutil.which(p, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")]


class ClusterError(RuntimeError):
    pass


class Cluster:
    def __init__(self, nodes=1, cpus=8, base=None, name="fsdptest", die_with_parent=True, first_job_id=None):
        if nodes not in (1, 2):
            raise ValueError("nodes must be 1 or 2")
        # Job ids unique across the clusters on this machine (see the module's docstring).
        self.first_job_id = first_job_id or random.SystemRandom().randrange(1_000, 60_000_000)
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.cpus = cpus
        self.name = name
        self.dir = base
        self.procs = {}
        self.die_with_parent = die_with_parent

    # ------------------------------------------------------------------ layout
    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    @property
    def conf(self):
        return self.path("etc", "slurm.conf")

    def env(self, base=None):
        """The environment for Slurm commands and jobs on this cluster."""
        e = dict(os.environ if base is None else base)
        e["SLURM_CONF"] = self.conf
        e[MARK] = self.dir
        e["PATH"] = e.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
        for k in [k for k in e if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del e[k]  # an outer allocation's variables must not leak into this cluster's jobs
        return e

    def _write_configs(self):
        host = socket.gethostname().split(".")[0]
        ctld_port, *node_ports = free_ports(1 + len(self.nodes))
        d = self.dir
        user = pwd.getpwuid(os.getuid()).pw_name
        lines = f"""# Written by tests/slurm/cluster.py: a private test cluster, removed when it stops.
ClusterName={self.name}
FirstJobId={self.first_job_id}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={node_ports[0]}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.socket,cred_expire=10
StateSaveLocation={d}/ctld/state
SlurmctldPidFile={d}/ctld/slurmctld.pid
SlurmctldLogFile={d}/ctld/slurmctld.log
SlurmdSpoolDir={d}/%n/spool
SlurmdPidFile={d}/%n/slurmd.pid
SlurmdLogFile={d}/%n/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
EnforcePartLimits=ALL
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0,sched_interval=1
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout=300
InactiveLimit=0
KillWait=5
MinJobAge=600
MessageTimeout=30
JobRequeue=1
"""
        for n, port in zip(self.nodes, node_ports):
            lines += f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname={n} Port={port} CPUs={self.cpus} State=UNKNOWN\n"
        lines += f"PartitionName=test Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP\n"
        os.makedirs(self.path("etc"))
        with open(self.conf, "w") as f:
            f.write(lines)
        for n in self.nodes:
            os.makedirs(self.path(n, "etc"))
            os.makedirs(self.path(n, "spool"))
            os.makedirs(self.path(n, "pmix"))
            shutil.copy(self.conf, self.path(n, "etc", "slurm.conf"))
            with open(self.path(n, "etc", "mpi.conf"), "w") as f:
                f.write(f"PMIxCliTmpDirBase={self.path(n, 'pmix')}\n")

    # ------------------------------------------------------------------ processes
    def _spawn(self, key, cmd, log, env, prog=None):
        """prog: the program the pid ends up running, when cmd execs into another (unshare)."""
        out = open(log, "ab")
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True, cwd=self.dir,
                             preexec_fn=_die_with_parent if self.die_with_parent else None)
        out.close()
        self.procs[key] = p
        with open(self.path("pids", f"{key}.pid"), "w") as f:
            f.write(f"{p.pid} {prog or cmd[0]}\n")
        return p

    def _wait_for(self, what, cond, timeout, key=None):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if cond():
                return
            if key and self.procs[key].poll() is not None:
                raise ClusterError(f"{key} exited with {self.procs[key].returncode}: {self.log_tail(key)}")
            time.sleep(0.1)
        raise ClusterError(f"{what} not ready after {timeout} s: {self.log_tail(key) if key else ''}")

    def log_tail(self, key, n=1500):
        log = {"munged": self.path("munge", "munged.log"), "slurmctld": self.path("ctld", "slurmctld.log")}.get(
            key, self.path(key, "slurmd.log"))
        text = ""
        for p in [log, self.path("pids", f"{key}.out")]:
            if os.path.exists(p):
                text += open(p, errors="replace").read()
        return text[-n:]

    def start(self, timeout=60):
        miss = missing_programs()
        if miss:
            raise ClusterError(f"not installed: {', '.join(miss)} (bash jobs/install-deps.sh --tests)")
        if self.dir is None:
            self.dir = tempfile.mkdtemp(prefix="fsdp_slurm_")
        os.chmod(self.dir, 0o755)
        os.makedirs(self.path("pids"))
        os.makedirs(self.path("munge"), mode=0o755)
        os.makedirs(self.path("ctld", "state"))
        self._write_configs()
        env = self.env()
        try:
            key = self.path("munge", "munge.key")
            subprocess.run(["mungekey", "-c", "-k", key], check=True, env=env, capture_output=True)
            sock = self.path("munge", "munge.socket")
            self._spawn("munged", ["munged", "-F", f"--socket={sock}", f"--key-file={key}",
                                   f"--log-file={self.path('munge', 'munged.log')}",
                                   f"--pid-file={self.path('munge', 'munged.pid')}",
                                   f"--seed-file={self.path('munge', 'munged.seed')}"],
                        self.path("pids", "munged.out"), env)
            self._wait_for("munged", lambda: os.path.exists(sock), 15, "munged")
            self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf], self.path("pids", "slurmctld.out"), env)
            for n in self.nodes:
                nenv = dict(env, SLURM_CONF=self.path(n, "etc", "slurm.conf"))
                # Each emulated node in its own UTS namespace, named after it: its slurmd, job
                # steps and tasks see hostname n1, n2, ... (module docstring).
                self._spawn(n, ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', n,
                                "slurmd", "-D", "-N", n, "-f", self.path(n, "etc", "slurm.conf")],
                            self.path("pids", f"{n}.out"), nenv, prog="slurmd")
            self._wait_for("the nodes", self._nodes_idle, timeout, "slurmctld")
        except BaseException:
            self.stop()
            raise
        return self

    def _nodes_idle(self):
        for key, p in self.procs.items():
            if p.poll() is not None:
                raise ClusterError(f"{key} exited with {p.returncode}: {self.log_tail(key)}")
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env(), capture_output=True, text=True)
        if r.returncode != 0:
            return False
        states = dict(l.split() for l in r.stdout.splitlines() if l.strip())
        return sorted(states) == self.nodes and all(s == "idle" for s in states.values())

    def stop(self):
        if not self.dir or not os.path.isdir(self.dir):
            return
        stop_dir(self.dir, self.procs)
        self.procs = {}

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------------ jobs
    def run(self, cmd, check=True, **kw):
        r = subprocess.run(cmd, env=kw.pop("env", self.env()), capture_output=True, text=True, **kw)
        if check and r.returncode != 0:
            raise ClusterError(f"{' '.join(cmd)}: exit {r.returncode}: {(r.stderr or r.stdout).strip()[-800:]}")
        return r

    def sbatch(self, args, cwd, env=None):
        """Submits; returns the job id."""
        r = self.run(["sbatch", "--parsable"] + list(args), cwd=cwd, env=env or self.env())
        return int(r.stdout.strip().split(";")[0])

    def job(self, jobid):
        """scontrol show job as a dict ({} once the job is gone)."""
        r = self.run(["scontrol", "show", "job", "-o", str(jobid)], check=False)
        if r.returncode != 0:
            return {}
        out = {}
        for tok in r.stdout.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                out.setdefault(k, v)
        return out

    def wait(self, jobid, timeout, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                           "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"), poll=0.2):
        """Polls (fast: sbatch --wait polls slowly) until the job reaches one of `states`; returns
        the job's dict. Raises on timeout."""
        t0 = time.time()
        while True:
            j = self.job(jobid)
            if j.get("JobState") in states:
                return j
            if time.time() - t0 > timeout:
                raise ClusterError(f"job {jobid} still {j.get('JobState')} after {timeout} s ({j.get('Reason')})")
            time.sleep(poll)


def _die_with_parent():
    """In the child before exec: SIGTERM when the parent goes (prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None


def _marked(pid, d):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MARK}={d}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_all(pids, timeout=10):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    t0 = time.time()
    while any(_alive(p) for p in pids) and time.time() - t0 < timeout:
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def stop_dir(d, procs=None):
    """Stops the cluster whose folder is d and removes d."""
    d = os.path.abspath(d)
    conf = os.path.join(d, "etc", "slurm.conf")
    env = dict(os.environ, SLURM_CONF=conf)
    env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/sbin"
    pidfiles = {}
    pdir = os.path.join(d, "pids")
    if os.path.isdir(pdir):
        for name in os.listdir(pdir):
            if name.endswith(".pid"):
                pid, prog = open(os.path.join(pdir, name)).read().split()
                pidfiles[name[:-4]] = (int(pid), prog)
    ctld = pidfiles.get("slurmctld")
    if ctld and _alive(ctld[0]):
        # Cancel what is still there so slurmd/slurmstepd end the job steps themselves.
        subprocess.run(["scancel", "--full", "--quiet", "--user=" + str(os.getuid())], env=env,
                       capture_output=True, timeout=30)
        t0 = time.time()
        while time.time() - t0 < 15:
            r = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i %T"], env=env, capture_output=True, text=True)
            if r.returncode != 0 or not any(s in r.stdout for s in ("RUNNING", "COMPLETING", "PENDING", "CONFIGURING")):
                break
            time.sleep(0.2)
    # The daemons, slurmd first, munged last; each pid checked against its program first.
    order = sorted(pidfiles, key=lambda k: {"slurmctld": 1, "munged": 2}.get(k, 0))
    for key in order:
        pid, prog = pidfiles[key]
        cmd = _cmdline(pid)
        if cmd and os.path.basename(cmd[0].decode(errors="replace")) == prog:
            _kill_all([pid])
        if procs and key in procs:
            try:
                procs[key].wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    # What outlived them: slurmstepd and job tasks carry the cluster's mark in their environment.
    left = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid() and _marked(int(p), d)]
    if left:
        _kill_all(left, timeout=5)
    shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("start")
    st.add_argument("--nodes", type=int, default=1)
    st.add_argument("--cpus", type=int, default=8)
    sp = sub.add_parser("stop")
    sp.add_argument("dir")
    a = ap.parse_args()
    if a.cmd == "start":
        c = Cluster(nodes=a.nodes, cpus=a.cpus, die_with_parent=False)
        c.start()
        # Leave the daemons running: detach from the Popen objects.
        print(f"export SLURM_CONF={c.conf} {MARK}={c.dir}")
        print(f"# stop with: {sys.argv[0]} stop {c.dir}")
    else:
        stop_dir(a.dir)


if __name__ == "__main__":
    main()
