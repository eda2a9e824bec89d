#!/usr/bin/python3
"""HYBRID_SHARD across real host boundaries, on one machine: hosts h1, h2, h3 made by hosts.sh
(each its own network namespace, hostname and /etc/hosts; a bridge between them; TCP on a private
subnet that exists only inside these namespaces). mpirun runs on h1 and reaches h2/h3 through
rsh-agent.sh, as it would through ssh; the node groups are DETECTED (fsdp.hybrid.shard_group_size
0: MPI_COMM_TYPE_SHARED), never configured.

  (a) probe: each rank's hostname and node-local rank, and the HYBRID_SHARD mesh fsdp_app's own
      code builds from them (tests/multihost/probe.cpp): ranks 0,1 on h1, 2,3 on h2
  (b) fsdp_app, HYBRID_SHARD, 2 hosts x 2 ranks: the loss curve equals a one-rank run of the same
      global batch (rel 1e-5), and the replicate all_reduce really crossed the hosts (h2's eth0)
  (c) the groups were detected: fsdp_app --plan on the hosts says "shard group N = 2, 2 replicas"
      and equals a one-host --plan with shard_group_size=2; the trained run's mem_peak_bytes
      (params, grads, optim) equal a one-host run with shard_group_size=2 exactly and differ from
      4-way FULL_SHARD
  (d) 3 hosts x 1 rank: probe (one rank per host, shard groups of 1, one replicate group of 3) and
      the loss curve against the same one-rank run; params bytes = the whole model

usage: multihost_test.py FSDP_APP MULTIHOST_PROBE   (root; Debian's /usr/bin/python3)
Prints PASS/FAIL/SKIP lines and the counts (pylib/report.py); exit 0, 1 (a failure) or 77
(skipped: not root, or no network namespaces here). MULTIHOST_KEEP=1 keeps the hosts up afterwards for poking
(then `tests/multihost/hosts.sh down`)."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: pylib
from pylib import launch  # noqa: E402
from pylib import metrics  # noqa: E402
from pylib.report import Report  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
HOSTS_SH = os.path.join(HERE, "hosts.sh")
AGENT = os.path.join(HERE, "rsh-agent.sh")
APP = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ""
PROBE = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else ""

PREFIX = os.environ.setdefault("FSDP_MH_PREFIX", "fsdpmh")
SUBNET = os.environ.setdefault("FSDP_MH_SUBNET", "10.77.0")
STEPS = 10
GLOBAL_BATCH = 48  # splits evenly over 1, 2, 3 and 4 ranks
LOSS_RTOL = 1e-5
MPI_TIMEOUT = 120

ENV = dict(launch.ENV, OMPI_MCA_btl_vader_single_copy_mechanism="none")

FASHION = "/usr/share/datasets/fashion-mnist"
CONFIG = os.path.join(REPO, "input", "fashion_mnist.yaml")
SETS = [f"train.steps={STEPS}", "train.eval_every=never", f"train.global_batch_size={GLOBAL_BATCH}",
        "train.threads=1", "output.log_every=1000"]
if not os.path.isdir(FASHION):  # the default job's data, when Debian's dataset-fashion-mnist is there
    SETS += ["data.kind=synthetic", "data.synthetic_samples=480"]


def multihost_mpirun(hosts):
    """mpirun on h1, launching on `hosts` ("h1:2,h2:2") through the agent, TCP on the test subnet.
    Nothing but the bare environment reaches the remote side: PATH etc. go with -x."""
    cmd = ["timeout", "-k", "10", str(MPI_TIMEOUT), HOSTS_SH, "run", "h1",
           "mpirun", "--oversubscribe", "--bind-to", "none", "--host", hosts,
           "-np", str(sum(int(h.split(":")[1]) for h in hosts.split(","))),
           "--mca", "plm_rsh_agent", AGENT, "--mca", "plm_rsh_no_tree_spawn", "1",
           "--mca", "orte_keep_fqdn_hostnames", "1",
           "--mca", "oob_tcp_if_include", f"{SUBNET}.0/24", "--mca", "btl_tcp_if_include", f"{SUBNET}.0/24",
           "--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp",
           # The simulated hosts share this machine's cores, which no host's mpirun/orted sees (each
           # has its slots): Open MPI's waits must yield, as mpirun makes them on one oversubscribed host.
           "--mca", "mpi_yield_when_idle", "1",
           "-x", "PATH", "-x", "OPENBLAS_NUM_THREADS", "-x", "OMP_NUM_THREADS"]
    if os.environ.get("LD_LIBRARY_PATH"):
        cmd += ["-x", "LD_LIBRARY_PATH"]
    # A sanitizer build (tests/sanitize.sh): the remote ranks need its options and suppressions.
    # ... and tests/mpi_env.sh's settings (HWLOC_COMPONENTS: no PCI discovery in each rank).
    for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "UCX_MEM_EVENTS", "UCX_MEM_MALLOC_HOOKS", "HWLOC_COMPONENTS"):
        if os.environ.get(var):
            cmd += ["-x", var]
    return cmd


def local_mpirun(np_):
    """The one-host reference runs: this machine's own namespaces, plain mpirun."""
    return ["timeout", "-k", "10", str(MPI_TIMEOUT)] + launch.mpirun(np_)


class Test(Report):
    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="fsdp_multihost_")

    def sh(self, cmd, what):
        t0 = time.time()
        p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.tmp)
        try:
            out, err = p.communicate()
        except BaseException:
            # Stopped (signal): SIGTERM to `timeout`, which passes it on to mpirun, which ends its
            # ranks and daemons; hosts.sh down then ends whatever is left inside the hosts.
            p.terminate()
            try:
                p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
            raise
        dt = time.time() - t0
        if p.returncode != 0:
            tail = (err.strip() or out.strip())[-1200:]
            raise RuntimeError(f"{what}: exit {p.returncode} after {dt:.1f} s{' (timeout)' if p.returncode == 124 else ''}:\n{tail}")
        return out, dt

    def app(self, launcher, tag, extra, plan=False):
        """fsdp_app on the given launcher; returns (stdout, metrics rows, seconds)."""
        metrics_path = os.path.join(self.tmp, f"{tag}.jsonl")
        cmd = launcher + [APP, CONFIG] + launch.set_args(SETS + extra + [f"output.metrics={metrics_path}"])
        if plan:
            cmd.append("--plan")
        out, dt = self.sh(cmd, tag)
        return out, [] if plan else metrics.rows(metrics_path), dt

    def probe(self, hosts):
        out, dt = self.sh(multihost_mpirun(hosts) + [PROBE, "HYBRID_SHARD", "0"], f"probe on {hosts}")
        ranks = []
        for line in out.splitlines():
            if line.startswith("probe rank="):
                d = dict(kv.split("=", 1) for kv in line.split()[1:])
                ranks.append({"rank": int(d["rank"]), "host": d["host"], "local_rank": int(d["local_rank"]),
                              "node_color": int(d["node_color"]), "local_size": int(d["local_size"]),
                              "shard": json.loads(d["shard"]), "replicate": json.loads(d["replicate"])})
        return ranks, out, dt


def losses(rows):
    return [r["loss"] for r in rows if "loss" in r and "step" in r]


def final_mem(rows):
    done = [r for r in rows if r.get("event") == "done"]
    return done[-1]["mem_peak_bytes"] if done else {}


def compare_losses(base, other):
    """(max relative diff, max absolute diff); inf when the curves differ in length."""
    if len(base) != len(other) or len(base) < STEPS:
        return float("inf"), float("inf")
    return (max(abs(a - b) / abs(a) for a, b in zip(base, other)), max(abs(a - b) for a, b in zip(base, other)))


def eth0_bytes(host):
    """(rx, tx) bytes of HOST's eth0, read from the host's own network namespace."""
    p = subprocess.run(["ip", "-n", f"{PREFIX}-{host}", "-s", "-j", "link", "show", "eth0"], capture_output=True,
                       text=True, check=True)
    s = json.loads(p.stdout)[0]["stats64"]
    return s["rx"]["bytes"], s["tx"]["bytes"]


def root_links():
    return subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout


def run_cases(t):
    # --- (a) probe: hostnames, node-local ranks and the mesh, 2 hosts x 2 ranks -------------------
    ranks, out, dt = t.probe("h1:2,h2:2")
    print(out.rstrip())
    hosts = [r["host"] for r in ranks]
    t.check("probe 2x2 hostnames", hosts == ["h1", "h1", "h2", "h2"], f"ranks 0..3 on {hosts} ({dt:.1f} s)")
    t.check("probe 2x2 node-local ranks", [(r["local_rank"], r["local_size"]) for r in ranks] == [(0, 2), (1, 2)] * 2,
            f"(local_rank, local_size) {[(r['local_rank'], r['local_size']) for r in ranks]}, "
            f"node_color {[r['node_color'] for r in ranks]}")
    t.check("probe 2x2 HYBRID_SHARD mesh (shard_group_size 0)",
            [r["shard"] for r in ranks] == [[0, 1], [0, 1], [2, 3], [2, 3]] and
            [r["replicate"] for r in ranks] == [[0, 2], [1, 3], [0, 2], [1, 3]],
            f"shard groups {sorted(set(tuple(r['shard']) for r in ranks))}, "
            f"replicate groups {sorted(set(tuple(r['replicate']) for r in ranks))}")

    # --- (b) loss curve: 2 hosts x 2 ranks against one rank --------------------------------------
    hybrid = ["fsdp.sharding_strategy=HYBRID_SHARD", "fsdp.hybrid.shard_group_size=0"]
    base_out, base_rows, base_dt = t.app(local_mpirun(1), "base_np1", ["fsdp.sharding_strategy=NO_SHARD"])
    base = losses(base_rows)
    rx0, tx0 = eth0_bytes("h2")
    mh_out, mh_rows, mh_dt = t.app(multihost_mpirun("h1:2,h2:2"), "hybrid_2x2", hybrid)
    rx1, tx1 = eth0_bytes("h2")
    mh = losses(mh_rows)
    rel, ab = compare_losses(base, mh)
    header = next((l for l in mh_out.splitlines() if l.startswith("fsdp_app:")), "")
    print(f"      {header}")
    print(f"      one rank   : {' '.join(f'{x:.6f}' for x in base)}  ({base_dt:.1f} s)")
    print(f"      2 hosts x 2: {' '.join(f'{x:.6f}' for x in mh)}  ({mh_dt:.1f} s)")
    t.check("HYBRID_SHARD 2 hosts x 2 ranks = one rank", rel <= LOSS_RTOL and "HYBRID_SHARD on 4 ranks" in header,
            f"{len(mh)} steps, max rel loss diff {rel:.2e} (max abs {ab:.2e}), tolerance {LOSS_RTOL:g}")

    # fsdp_app's own account of what it detected: the hosts, their ranks, one shard group per node.
    mesh = next((l for l in mh_out.splitlines() if l.startswith("mesh:")), "")
    print(f"      {mesh}")
    t.check("fsdp_app names the detected nodes and shard groups",
            mesh == "mesh: 2 nodes (h1: ranks 0,1; h2: ranks 2,3); shard groups of 2 (one per node, detected), 2 replicas",
            repr(mesh))

    # The replicate all_reduce (0.5 Psi per rank per step, from the plan below) must have crossed
    # the bridge: h2's two ranks send at least STEPS x 2 x 0.5 Psi through h2's eth0.
    psi = 4 * int(re.search(r"([\d,]+) parameters", header).group(1).replace(",", "")) if header else 0
    need = STEPS * 2 * psi // 2
    t.check("traffic between hosts over TCP on the test subnet", tx1 - tx0 >= need * 0.95 and rx1 - rx0 >= need * 0.95,
            f"h2 eth0 sent {(tx1 - tx0) / 2**20:.1f} MiB, received {(rx1 - rx0) / 2**20:.1f} MiB during the run "
            f"(replicate all_reduce alone: >= {need / 2**20:.1f} MiB each way)")

    # --- (c) the node groups were detected -------------------------------------------------------
    plan_mh, _, _ = t.app(multihost_mpirun("h1:2,h2:2"), "plan_2x2", hybrid, plan=True)
    plan_g2, _, _ = t.app(local_mpirun(4), "plan_1x4_g2", ["fsdp.sharding_strategy=HYBRID_SHARD",
                                                          "fsdp.hybrid.shard_group_size=2"], plan=True)
    plan_g0, _, _ = t.app(local_mpirun(4), "plan_1x4_g0", hybrid, plan=True)
    head = plan_mh.splitlines()[0] if plan_mh else ""
    print(f"      {head}")
    t.check("--plan on 2 hosts x 2 detects shard groups of 2",
            "shard group N = 2, 2 replicas" in head and plan_mh == plan_g2 and plan_mh != plan_g0,
            f"equals one host with shard_group_size=2: {plan_mh == plan_g2}; differs from one host x 4 with "
            f"shard_group_size=0 (N = 4): {plan_mh != plan_g0}")

    _, g2_rows, g2_dt = t.app(local_mpirun(4), "hybrid_1x4_g2", ["fsdp.sharding_strategy=HYBRID_SHARD",
                                                                "fsdp.hybrid.shard_group_size=2"])
    _, fs_rows, fs_dt = t.app(local_mpirun(4), "full_1x4", ["fsdp.sharding_strategy=FULL_SHARD"])
    keys = ("params", "grads", "optim", "gathered")
    m_mh, m_g2, m_fs = final_mem(mh_rows), final_mem(g2_rows), final_mem(fs_rows)
    print(f"      mem_peak_bytes  {'':14} " + " ".join(f"{k:>10}" for k in keys))
    for name, m in (("2 hosts x 2, group 0", m_mh), ("1 host x 4, group 2", m_g2), ("1 host x 4, FULL", m_fs)):
        print(f"      {name:30} " + " ".join(f"{m.get(k, -1):>10}" for k in keys))
    same = all(k in m_mh and m_mh[k] == m_g2.get(k) for k in keys)
    t.check("per-rank memory = 2-way shard groups", same and m_mh.get("params") != m_fs.get("params"),
            f"params {m_mh.get('params')} B = one host with shard_group_size=2 ({m_g2.get('params')} B), "
            f"not 4-way FULL_SHARD ({m_fs.get('params')} B); ({g2_dt:.1f} s, {fs_dt:.1f} s)")
    rel2, _ = compare_losses(base, losses(g2_rows))
    t.check("one host x 4, shard_group_size=2 = one rank", rel2 <= LOSS_RTOL, f"max rel loss diff {rel2:.2e}")

    # --- (d) 3 hosts x 1 rank --------------------------------------------------------------------
    ranks3, out3, dt3 = t.probe("h1:1,h2:1,h3:1")
    print(out3.rstrip())
    t.check("probe 3x1 hostnames and mesh",
            [r["host"] for r in ranks3] == ["h1", "h2", "h3"] and [r["local_rank"] for r in ranks3] == [0, 0, 0] and
            [r["shard"] for r in ranks3] == [[0], [1], [2]] and all(r["replicate"] == [0, 1, 2] for r in ranks3),
            f"hosts {[r['host'] for r in ranks3]}, node_color {[r['node_color'] for r in ranks3]}, "
            f"shard groups {[r['shard'] for r in ranks3]} ({dt3:.1f} s)")
    _, r3_rows, r3_dt = t.app(multihost_mpirun("h1:1,h2:1,h3:1"), "hybrid_3x1", hybrid)
    rel3, ab3 = compare_losses(base, losses(r3_rows))
    p3 = final_mem(r3_rows).get("params")
    t.check("HYBRID_SHARD 3 hosts x 1 rank = one rank", rel3 <= LOSS_RTOL and p3 == psi,
            f"max rel loss diff {rel3:.2e} (max abs {ab3:.2e}); params {p3} B = whole model {psi} B "
            f"(shard groups of 1) ({r3_dt:.1f} s)")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    if os.geteuid() != 0:
        return skipped("needs root (network namespaces)")
    t = Test()
    print(f"hosts: {HOSTS_SH} (netns {PREFIX}-h1..h3, subnet {SUBNET}.0/24); data: "
          f"{'fashion_mnist' if os.path.isdir(FASHION) else 'synthetic'}, global batch {GLOBAL_BATCH}, {STEPS} steps",
          flush=True)
    links_before = root_links()
    p = subprocess.run([HOSTS_SH, "up", "3"], capture_output=True, text=True)
    if p.returncode == 3:
        shutil.rmtree(t.tmp, ignore_errors=True)
        return skipped(p.stderr.strip())
    if not t.check("hosts up", p.returncode == 0, (p.stdout + p.stderr).strip()):
        # Exit 2: refused because the names exist (maybe another run's): nothing of ours to remove.
        # Exit 1: hosts.sh removed what it had made itself.
        return 1
    try:
        routes = {h: subprocess.run(["ip", "-n", f"{PREFIX}-{h}", "route"], capture_output=True, text=True).stdout.strip()
                  for h in ("h1", "h2", "h3")}
        t.check("isolation", all(r == f"{SUBNET}.0/24 dev eth0 proto kernel scope link src {SUBNET}.{i + 1}"
                                 for i, r in enumerate(routes.values())) and root_links() == links_before,
                "each host routes only its own /24 (no default route); the root namespace's links are unchanged")
        try:
            run_cases(t)
        except Exception as e:  # noqa: BLE001 - any error is a failure with its reason
            t.check("multihost", False, f"error: {e}")
    finally:
        if os.environ.get("MULTIHOST_KEEP") == "1":
            print(f"hosts kept up (MULTIHOST_KEEP=1): remove with {HOSTS_SH} down")
        else:
            d = subprocess.run([HOSTS_SH, "down"], capture_output=True, text=True)
            left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            gone = d.returncode == 0 and not re.search(rf"^{re.escape(PREFIX)}-", left, re.M) and \
                not os.path.exists(f"/run/{PREFIX}") and root_links() == links_before
            t.check("hosts down", gone, "namespaces, bridge, veths, sleepers and state removed" if gone else
                    f"left over: {left.strip()} {d.stderr.strip()}")
    t.print_counts()
    if t.failed:
        print(f"  files kept in {t.tmp}")
    else:
        shutil.rmtree(t.tmp, ignore_errors=True)
    return t.exit_code()


def skipped(why):
    """The whole suite cannot run here: one skipped case, exit 77."""
    r = Report()
    r.skip("multihost", why)
    r.print_counts()
    return r.exit_code()


def on_signal(signum, _frame):
    # meson's timeout and Ctrl-C: leave through the finally blocks, so the hosts are removed; a
    # second signal must not cut that clean-up short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise SystemExit(f"multihost: stopped by signal {signum}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sys.exit(main())
