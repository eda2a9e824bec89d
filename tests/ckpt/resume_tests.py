#!/usr/bin/python3
"""Checkpoint resume, end to end through fsdp_app under mpirun.

  a. bitwise resume: n steps in one launch == k steps (train.stop_after_steps, mid-epoch), then
     checkpoint.resume=auto (or =PATH) for the rest: the final checkpoints' tensors (/model and
     /optim, or /shards) are bitwise equal and so is every step's loss in the metrics.
  b. reshard: saved at one world size / strategy / wrap policy, resumed at another, both formats,
     optimizer state included: the losses after the reload equal the uninterrupted run's within
     float-reordering tolerance, and the step count continues.
  c. every_steps + keep prune to the newest files; save_best's best.h5 holds the best evaluation.
  d. crash safety: a rank SIGKILLed in the middle of a save (FSDP_TEST_KILL_RANK_DURING_SAVE)
     leaves no new complete file and the old one resumes bitwise; the whole job SIGKILLed at
     random moments during frequent saves always resumes (incomplete files are skipped).

usage: resume_tests.py FSDP_APP        (Debian's /usr/bin/python3 with h5py, numpy)
Prints one PASS/FAIL line per check; exits non-zero on any failure."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: pylib
from pylib.ckpt import bitwise_diff, ckpt_files, ckpt_name, complete_ckpts, h5_attrs  # noqa: E402
from pylib.configs import MODELS  # noqa: E402
from pylib.harness import Harness  # noqa: E402
from pylib.launch import ENV  # noqa: E402
from pylib.metrics import eval_rows, step_losses  # noqa: E402
from pylib.metrics import rows as metrics_rows  # noqa: E402

H = Harness(sys.argv[1], "fsdp_ckpt_resume_")
LOSS_RTOL = 1e-4  # reshard: losses after a reload at another world size (float reordering only)
STEPS = 10        # 4 steps per epoch: every stop below is mid-epoch


def sets(model, steps, ckdir, metrics, extra=()):
    return MODELS[model] + [f"train.steps={steps}", f"checkpoint.dir={ckdir}", f"output.metrics={metrics}"] + list(extra)


def resumed_at(out):
    """(path, step) from 'checkpoint: resumed from PATH at step K', or None."""
    m = re.search(r"checkpoint: resumed from (\S+) at step (\d+)", out)
    return (m.group(1), int(m.group(2))) if m else None


def same_position(a, b):
    """The root attributes that say where a run stands must agree between two final files."""
    aa, ab = h5_attrs(a), h5_attrs(b)
    keys = ["step", "epoch", "step_in_epoch", "optimizer_step", "lr", "best_eval_loss", "optimizer"]
    bad = [k for k in keys if aa.get(k) != ab.get(k)]
    return not bad, bad


# ---------------------------------------------------------------------------------------------
# a. bitwise resume

def bitwise_case(name, model, np_, k, extra, explicit=False):
    d = H.path(name)
    n = STEPS
    H.run_ok(np_, sets(model, n, f"{d}/U", f"{d}/U.jsonl", extra))
    if explicit:
        # The first launch saves every 2 steps and stops at k; the resume names an older file
        # (ckpt_4) in another folder, so auto would have picked a different one.
        H.run_ok(np_, sets(model, n, f"{d}/S", f"{d}/S.jsonl",
                           extra + [f"train.stop_after_steps={k}", "checkpoint.every_steps=2", "checkpoint.keep=10"]))
        src = f"{d}/S/{ckpt_name(4)}"
        start = 4
        with open(f"{d}/S.jsonl") as f, open(f"{d}/R.jsonl", "w") as g:  # the metrics up to step 4
            for line in f:
                row = json.loads(line)
                if "loss" in row and row["step"] <= start:
                    g.write(line)
        r = H.run_ok(np_, sets(model, n, f"{d}/R", f"{d}/R.jsonl", extra + [f"checkpoint.resume={src}"]))
        final, metrics = f"{d}/R/{ckpt_name(n)}", f"{d}/R.jsonl"
    else:
        s = H.run_ok(np_, sets(model, n, f"{d}/S", f"{d}/S.jsonl", extra + [f"train.stop_after_steps={k}"]))
        if complete_ckpts(f"{d}/S") != [ckpt_name(k)] or len(step_losses(f"{d}/S.jsonl")) != k:
            raise RuntimeError(f"stopped launch left {ckpt_files(f'{d}/S')} and "
                               f"{len(step_losses(f'{d}/S.jsonl'))} loss rows: {s.out[-300:]}")
        src, start = f"{d}/S/{ckpt_name(k)}", k
        r = H.run_ok(np_, sets(model, n, f"{d}/S", f"{d}/S.jsonl", extra + ["checkpoint.resume=auto"]))
        final, metrics = f"{d}/S/{ckpt_name(n)}", f"{d}/S.jsonl"
    at = resumed_at(r.out)
    H.check(f"{name}: resumed from the right file", at == (src, start), f"expected {src} at step {start}, got {at}")
    ok, text = bitwise_diff(f"{d}/U/{ckpt_name(n)}", final)
    pos_ok, bad = same_position(f"{d}/U/{ckpt_name(n)}", final)
    H.check(f"{name}: final checkpoint bitwise equal", ok and pos_ok,
            f"{text}; position attributes {'equal' if pos_ok else 'differ: ' + str(bad)}")
    lu, lr = step_losses(f"{d}/U.jsonl"), step_losses(metrics)
    steps_ok = [s for s, _ in lr] == list(range(1, n + 1))
    same = lu == lr
    H.check(f"{name}: per-step losses equal exactly", same and steps_ok,
            f"{len(lr)} steps {lr[0][0] if lr else '-'}..{lr[-1][0] if lr else '-'}, resumed at {start}"
            + ("" if same else f", first difference at step "
               f"{next((a[0] for a, b in zip(lu, lr) if a != b), min(len(lu), len(lr)) + 1)}"))


# ---------------------------------------------------------------------------------------------
# b. reshard

_baselines = {}


def baseline(model):
    """The uninterrupted run's per-step losses (np=4 FULL_SHARD)."""
    if model not in _baselines:
        d = H.path(f"base_{model}")
        H.run_ok(4, sets(model, STEPS, f"{d}/U", f"{d}/U.jsonl"))
        _baselines[model] = dict(step_losses(f"{d}/U.jsonl"))
    return _baselines[model]


def reshard_case(name, model, fmt, np_a, np_b, extra_a=(), extra_b=(), k=6):
    base = baseline(model)
    d = H.path(re.sub(r"[^A-Za-z0-9_.-]+", "_", name))
    n = STEPS
    fm = [f"checkpoint.format={fmt}"]
    H.run_ok(np_a, sets(model, n, f"{d}/C", f"{d}/M.jsonl", fm + list(extra_a) + [f"train.stop_after_steps={k}"]))
    r = H.run_ok(np_b, sets(model, n, f"{d}/C", f"{d}/M.jsonl", fm + list(extra_b) + ["checkpoint.resume=auto"]))
    rows = step_losses(f"{d}/M.jsonl")
    at = resumed_at(r.out)
    writer = re.search(r"written by (\d+) rank", r.out)
    attrs = h5_attrs(f"{d}/C/{ckpt_name(n)}") if os.path.exists(f"{d}/C/{ckpt_name(n)}") else {}
    cont = ([s for s, _ in rows] == list(range(1, n + 1)) and at is not None and at[1] == k and
            writer is not None and int(writer.group(1)) == np_a and attrs.get("step") == n and
            attrs.get("optimizer_step") == n and attrs.get("world_size") == np_b)
    after = [abs(l - base[s]) / abs(base[s]) for s, l in rows if s > k]
    before = [abs(l - base[s]) / abs(base[s]) for s, l in rows if s <= k]
    worst = max(after) if after else float("inf")
    H.check(f"{name}: steps continue", cont,
            f"resumed at {at[1] if at else None} (written by {writer.group(1) if writer else '?'} ranks), steps "
            f"{rows[0][0] if rows else '-'}..{rows[-1][0] if rows else '-'}, final file step {attrs.get('step')} "
            f"optimizer_step {attrs.get('optimizer_step')} world_size {attrs.get('world_size')}")
    H.check(f"{name}: losses after reload match", len(after) == n - k and worst <= LOSS_RTOL,
            f"max rel diff {worst:.2e} over steps {k + 1}..{n} (before the stop: "
            f"{max(before) if before else float('nan'):.2e}; tolerance {LOSS_RTOL:g})")
    return worst


# ---------------------------------------------------------------------------------------------
# c. every_steps / keep / save_best

def keep_case():
    d = H.path("keep")
    H.run_ok(2, sets("transformer", STEPS, f"{d}/C", f"{d}/M.jsonl",
                     ["checkpoint.every_steps=2", "checkpoint.keep=2", "checkpoint.format=sharded"]))
    files = ckpt_files(f"{d}/C")
    saved = [r["step"] for r in metrics_rows(f"{d}/M.jsonl") if r.get("event") == "checkpoint"]
    want = [ckpt_name(8), ckpt_name(10)]
    steps_ok = all(h5_attrs(f"{d}/C/{f}")["step"] == int(f[5:13]) for f in files if f in want)
    H.check("keep: every_steps=2 keep=2 leaves the newest two", files == want and saved == [2, 4, 6, 8, 10] and steps_ok,
            f"saved at steps {saved}, folder holds {files}")


def save_best_case():
    d = H.path("best")
    # A large learning rate so the eval loss on synthetic tokens does not only go down.
    H.run_ok(2, sets("transformer", 12, f"{d}/C", f"{d}/M.jsonl",
                     ["train.eval_every=2", "checkpoint.save_best=true", "checkpoint.every_steps=2",
                      "checkpoint.keep=100", "train.optimizer.lr=0.05"]))
    evals = [(r["step"], r["eval_loss"]) for r in eval_rows(f"{d}/M.jsonl")]
    best_step, best_loss = min(evals, key=lambda e: e[1])
    attrs = h5_attrs(f"{d}/C/best.h5")
    stored = float(attrs["best_eval_loss"])
    same_weights, text = bitwise_diff(f"{d}/C/best.h5", f"{d}/C/{ckpt_name(best_step)}", optim=False)
    ok = float(f"{stored:.9g}") == best_loss and attrs["step"] == best_step and same_weights
    H.check("save_best: best.h5 holds the best evaluation", ok,
            f"evals {[(s, round(l, 5)) for s, l in evals]}; best.h5 best_eval_loss {stored:.9g} at step "
            f"{attrs['step']}, min in metrics {best_loss:.9g} at step {best_step}; /model vs "
            f"{ckpt_name(best_step)}: {text}")


def formats_case():
    """The same run saved in both formats: the same tensors (the sharded file read through its index)."""
    d = H.path("formats")
    for fmt in ["consolidated", "sharded"]:
        H.run_ok(3, sets("transformer", 5, f"{d}/{fmt}", f"{d}/{fmt}.jsonl", [f"checkpoint.format={fmt}"]))
    ok, text = bitwise_diff(f"{d}/consolidated/{ckpt_name(5)}", f"{d}/sharded/{ckpt_name(5)}")
    H.check("formats: consolidated and sharded files of one run hold the same tensors", ok, text)


# ---------------------------------------------------------------------------------------------
# d. crash safety

def kill_during_save_case(name, fmt, np_, rank, timeout=20):
    d = H.path(name)
    n, k = 12, 5
    extra = [f"checkpoint.format={fmt}"]
    H.run_ok(np_, sets("transformer", n, f"{d}/U", f"{d}/U.jsonl", extra))
    H.run_ok(np_, sets("transformer", n, f"{d}/C", f"{d}/M1.jsonl", extra + [f"train.stop_after_steps={k}"]))
    # Resumes at 5, saves at 6: rank `rank` SIGKILLs itself in the middle of that save.
    killed = H.run(np_, sets("transformer", n, f"{d}/C", f"{d}/M2.jsonl",
                             extra + ["checkpoint.resume=auto", "checkpoint.every_steps=3"]),
                   env={"FSDP_TEST_KILL_RANK_DURING_SAVE": str(rank)}, timeout=timeout)
    after_kill = ckpt_files(f"{d}/C")
    complete = complete_ckpts(f"{d}/C")
    old = h5_attrs(f"{d}/C/{ckpt_name(k)}") if ckpt_name(k) in complete else {}
    hung = killed.seconds >= timeout - 0.5
    died = killed.rc != 0 and not hung and "checkpoint: step 6 saved" not in killed.out
    H.check(f"{name}: rank {rank} killed during the save ends the job, no new complete file", died and
            complete == [ckpt_name(k)] and old.get("step") == k,
            f"mpirun exit {killed.rc} after {killed.seconds:.1f} s{' (HUNG until the timeout)' if hung else ''}; "
            f"folder holds {after_kill}")
    r = H.run_ok(np_, sets("transformer", n, f"{d}/C", f"{d}/M3.jsonl",
                           extra + ["checkpoint.resume=auto", "checkpoint.every_steps=3"]))
    at = resumed_at(r.out)
    ok, text = bitwise_diff(f"{d}/U/{ckpt_name(n)}", f"{d}/C/{ckpt_name(n)}")
    losses_ok = step_losses(f"{d}/M3.jsonl") == step_losses(f"{d}/U.jsonl")[k:]
    left = [f for f in ckpt_files(f"{d}/C") if f.endswith(".tmp")]
    H.check(f"{name}: the old file resumes bitwise", at is not None and at[1] == k and ok and losses_ok and not left,
            f"resumed at step {at[1] if at else None}; {text}; losses {'equal' if losses_ok else 'differ'}; "
            f".tmp left after the good run: {left}")


def descendants(pid):
    """Every process below pid (Open MPI puts its ranks in process groups of their own)."""
    children = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(p))
        except (OSError, IndexError, ValueError):
            pass
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def random_kill_case(rounds=5):
    """Each round: a fresh run saving every step is SIGKILLed (every process of the launch) at a
    random moment; resume=auto must then start from the newest complete file (or fresh) and
    finish bitwise equal to the uninterrupted run."""
    seed = int(os.environ.get("CKPT_TEST_SEED", time.time()))
    rng = random.Random(seed)
    n, np_ = 12, 3
    extra = ["checkpoint.every_steps=1", "checkpoint.keep=2"]
    d0 = H.path("random_kill")
    u = H.run_ok(np_, sets("mnist_cnn", n, f"{d0}/U", f"{d0}/U.jsonl", extra))
    span = u.seconds
    good, mid_save, resumed_from = 0, 0, []
    for i in range(rounds):
        d = H.path(f"random_kill/{i}")
        fmt = ["consolidated", "sharded"][i % 2]
        run_sets = sets("mnist_cnn", n, f"{d}/C", f"{d}/M.jsonl", extra + [f"checkpoint.format={fmt}",
                                                                         "checkpoint.resume=auto"])
        p = subprocess.Popen(H.command(np_, run_sets), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             cwd=H.tmp, start_new_session=True)
        delay = rng.uniform(0.3, span * 0.95)
        t0 = time.time()
        if i >= rounds - 2:
            # The last rounds wait (after a shorter random delay) until a save is under way, so
            # the kill lands inside one: polling sees a ckpt_*.h5.tmp within a millisecond.
            time.sleep(delay / 2)
            while p.poll() is None and time.time() - t0 < 60 and \
                    not any(f.endswith(".tmp") for f in ckpt_files(f"{d}/C")):
                time.sleep(0.001)
            delay = time.time() - t0
        else:
            time.sleep(delay)
        # Every process of this launch at once: the app ranks, mpirun and timeout.
        victims = descendants(p.pid)
        for pid in sorted(victims, reverse=True) + [p.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()
        left = ckpt_files(f"{d}/C")
        done = complete_ckpts(f"{d}/C")
        newest = int(done[-1][5:13]) if done else 0
        mid_save += any(f.endswith(".tmp") for f in left)
        r = H.run(np_, run_sets)
        at = resumed_at(r.out)
        got = at[1] if at else (0 if "starting fresh" in r.out else None)
        same, text = bitwise_diff(f"{d0}/U/{ckpt_name(n)}", f"{d}/C/{ckpt_name(n)}") \
            if r.rc == 0 else (False, "")
        ok = r.rc == 0 and got == newest and same
        good += ok
        resumed_from.append(got)
        print(f"      round {i} ({fmt}): killed {len(victims) + 1} processes after {delay:.2f} s, folder {left}; "
              f"resume=auto from step {got}: " + (f"finished, {text}" if r.rc == 0 else
                                                   f"FAILED exit {r.rc}: {r.err.strip()[-1500:]}"), flush=True)
    H.check(f"random kill -9, {rounds} rounds (seed {seed}): resume=auto always works and ends bitwise equal",
            good == rounds, f"{good}/{rounds} rounds good; resumed from steps {resumed_from}; {mid_save} kills "
            f"landed in a save (.tmp left); uninterrupted run {span:.1f} s")


# ---------------------------------------------------------------------------------------------

def main():
    print("a. bitwise resume (n=10 steps, 4 per epoch)", flush=True)
    H.case("bitwise FULL_SHARD np=4 consolidated (mnist_cnn adadelta)", bitwise_case,
           "bitwise_full_np4", "mnist_cnn", 4, 5, ["fsdp.sharding_strategy=FULL_SHARD"])
    H.case("bitwise HYBRID_SHARD np=4 sg=2 sharded (transformer adamw)", bitwise_case,
           "bitwise_hybrid_np4", "transformer", 4, 6,
           ["fsdp.sharding_strategy=HYBRID_SHARD", "fsdp.hybrid.shard_group_size=2", "checkpoint.format=sharded"])
    H.case("bitwise adamw + dropout np=3 sharded", bitwise_case, "bitwise_adamw_dropout", "transformer", 3, 7,
           ["train.dropout=true", "fsdp.sharding_strategy=FULL_SHARD", "checkpoint.format=sharded"])
    H.case("bitwise mnist_cnn adamw + dropout np=2", bitwise_case, "bitwise_cnn_adamw_dropout", "mnist_cnn", 2, 5,
           ["train.dropout=true", "train.optimizer.kind=adamw", "train.optimizer.lr=0.001"])
    H.case("bitwise t5 + dropout np=3 sharded", bitwise_case, "bitwise_t5_dropout", "t5", 3, 5,
           ["train.dropout=true", "fsdp.sharding_strategy=FULL_SHARD", "checkpoint.format=sharded"])
    H.case("bitwise explicit resume PATH np=2 SHARD_GRAD_OP", bitwise_case, "bitwise_explicit", "transformer", 2, 7,
           ["train.dropout=true", "fsdp.sharding_strategy=SHARD_GRAD_OP"], True)

    print("b. reshard (stop at step 6 of 10, resume elsewhere)", flush=True)
    worst = {}
    for fmt in ["consolidated", "sharded"]:
        for a, b in [(4, 3), (8, 2), (2, 5)]:
            # The CNN at 4->3 in each format (and in two cases below); the other pairs' world
            # sizes are the transformer's to cover: a CNN case costs 4-7 s, a transformer one 1 s.
            for model in ["mnist_cnn", "transformer"] if (a, b) == (4, 3) else ["transformer"]:
                name = f"reshard {model} {fmt} np {a}->{b}"
                H.case(name, lambda *x: worst.__setitem__(x[0], reshard_case(*x)), name, model, fmt, a, b)
    H.case("reshard transformer FULL_SHARD np4 -> NO_SHARD np2", lambda *x: worst.__setitem__(x[0], reshard_case(*x)),
           "reshard transformer FULL_SHARD->NO_SHARD 4->2", "transformer", "sharded", 4, 2,
           ["fsdp.sharding_strategy=FULL_SHARD"], ["fsdp.sharding_strategy=NO_SHARD"])
    H.case("reshard mnist_cnn FULL_SHARD np4 -> SHARD_GRAD_OP np3", lambda *x: worst.__setitem__(x[0], reshard_case(*x)),
           "reshard mnist_cnn FULL_SHARD->SHARD_GRAD_OP 4->3", "mnist_cnn", "consolidated", 4, 3,
           ["fsdp.sharding_strategy=FULL_SHARD"], ["fsdp.sharding_strategy=SHARD_GRAD_OP"])
    H.case("reshard transformer HYBRID np4 -> FULL_SHARD np3", lambda *x: worst.__setitem__(x[0], reshard_case(*x)),
           "reshard transformer HYBRID_SHARD(sg2)->FULL_SHARD 4->3", "transformer", "sharded", 4, 3,
           ["fsdp.sharding_strategy=HYBRID_SHARD", "fsdp.hybrid.shard_group_size=2"], [])
    H.case("reshard transformer wrap transformer_layer -> size_based", lambda *x: worst.__setitem__(x[0], reshard_case(*x)),
           "reshard transformer wrap transformer_layer->size_based(3000) 4->3", "transformer", "sharded", 4, 3,
           [], ["fsdp.auto_wrap.policy=size_based", "fsdp.auto_wrap.min_num_params=3000"])
    H.case("reshard mnist_cnn min_num_params 100 -> 200000", lambda *x: worst.__setitem__(x[0], reshard_case(*x)),
           "reshard mnist_cnn min_num_params 100->200000 + NO_SHARD 4->2", "mnist_cnn", "sharded", 4, 2,
           [], ["fsdp.auto_wrap.min_num_params=200000", "fsdp.sharding_strategy=NO_SHARD"])
    H.case("reshard t5 blocks np4 -> nested size_based np3", lambda *x: worst.__setitem__(x[0], reshard_case(*x)),
           "reshard t5 transformer_layer->size_based(500) 4->3", "t5", "sharded", 4, 3,
           [], ["fsdp.auto_wrap.policy=size_based", "fsdp.auto_wrap.min_num_params=500"])
    if worst:
        print(f"      max rel loss diff after reload over all reshard cases: {max(worst.values()):.2e}", flush=True)

    print("c. every_steps / keep / save_best", flush=True)
    H.case("keep", keep_case)
    H.case("save_best", save_best_case)
    H.case("formats", formats_case)

    print("d. crash safety", flush=True)
    H.case("kill rank 0 during save (np=1)", kill_during_save_case, "kill_save_np1", "consolidated", 1, 0)
    H.case("kill rank 1 during save (consolidated np=4)", kill_during_save_case, "kill_save_np4_r1", "consolidated", 4, 1)
    H.case("kill rank 0 during save (sharded np=3)", kill_during_save_case, "kill_save_np3_r0", "sharded", 3, 0)
    H.case("random kill -9", random_kill_case)
    H.finish()


if __name__ == "__main__":
    main()
