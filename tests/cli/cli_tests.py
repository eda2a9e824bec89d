#!/usr/bin/python3
"""fsdp_bench's and fsdp_ckpt's command lines as a user meets them (CLI11 through apps/cli.h).

A bad command line is exactly one line on stderr, "PROGRAM: what (try --help)" or the program's
own check, nothing on stdout, and exit status 2; under mpirun -np 2 still one line (rank 0's).
--help (and a command's --help) exits 0 with every option and command on stdout. Good values in
every spelling (-b1K, --minbytes=1K, options before or after fsdp_ckpt's command) are accepted.
fsdp_app's own cases are in tests/test_app.cpp; the file-handling ones of fsdp_ckpt in
tests/ckpt/tool_tests.py. Nothing here trains or reads a checkpoint: seconds.

usage: cli_tests.py FSDP_BENCH FSDP_CKPT      (Debian's /usr/bin/python3, stdlib only)
Prints one PASS/FAIL line per check and the counts (pylib/report.py); exits 1 when any failed."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: pylib
from pylib import launch  # noqa: E402
from pylib.report import Report  # noqa: E402

BENCH, CKPT = (os.path.abspath(p) for p in sys.argv[1:3])
ENV = dict(launch.ENV)
ENV.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")  # as tests/mpirun.sh
R = Report()
COMMANDS = "inspect, verify, consolidate, reshard or export-hf"


def run(exe, args, np_=None):
    cmd = ["timeout", "--kill-after=10", "120"] + (launch.mpirun(np_) if np_ else []) + [exe, *args]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True)


def expect_line(exe, args, line, rc=2):
    """A bad command line: exactly `line` (after the program's name) on stderr, exit rc."""
    p = run(exe, args)
    prog = os.path.basename(exe)
    want = f"{prog}: {line}\n"
    R.check(f"{prog} {' '.join(args) or '(nothing)'}: one line, exit {rc}",
            p.returncode == rc and p.stderr == want and p.stdout == "",
            f"rc {p.returncode}, stderr {p.stderr!r} (want {want!r}), stdout {p.stdout[:200]!r}")


def expect_help(exe, args, needles):
    """--help: exit 0, nothing on stderr, every needle on stdout."""
    p = run(exe, args)
    missing = [n for n in needles if n not in p.stdout]
    R.check(f"{os.path.basename(exe)} {' '.join(args)}: exit 0, lists every option",
            p.returncode == 0 and p.stderr == "" and not missing,
            f"rc {p.returncode}, missing {missing}, stderr {p.stderr!r}, stdout {p.stdout!r}")
    return p.stdout


def bench_cases():
    expect_line(BENCH, ["--bogus"], "unknown option '--bogus' (try --help)")
    expect_line(BENCH, ["--bogus=1K"], "unknown option '--bogus' (try --help)")
    expect_line(BENCH, ["-x"], "unknown option '-x' (try --help)")
    expect_line(BENCH, ["-n", "2", "extra"], "unexpected argument 'extra' (try --help)")
    for bad in ("0", "x", "-1", "1.5", "1073741825"):
        expect_line(BENCH, ["-n", bad], f"--iters: expected an integer in [1, 1073741824], got '{bad}' (try --help)")
    expect_line(BENCH, ["-n"], "--iters: 1 required INT missing (try --help)")
    expect_line(BENCH, ["--warmup_iters=-1"], "--warmup_iters: expected an integer in [0, 1073741824], got '-1' (try --help)")
    expect_line(BENCH, ["-f1"], "--stepfactor: expected an integer in [2, 1048576], got '1' (try --help)")
    expect_line(BENCH, ["-b", "1Q"], "--minbytes: unknown size suffix 'Q' in '1Q' (use K, M or G) (try --help)")
    expect_line(BENCH, ["--maxbytes", "x"],
                "--maxbytes: expected a size in bytes like 1024, 1K, 64M or 1G, got 'x' (try --help)")
    expect_line(BENCH, ["-e", "99999999999G"], "--maxbytes: '99999999999G' is too large (try --help)")
    expect_line(BENCH, ["-b", "0"], "-b 0: the smallest size must be at least 1 byte")
    expect_line(BENCH, ["-b", "2K", "-e", "1K"], "-e 1024 is smaller than -b 2048")
    expect_line(BENCH, ["--timeout", "0"], "--timeout: expected a positive number of seconds, got '0' (try --help)")
    expect_line(BENCH, ["-d", "f8"],
                "--datatype: unknown dtype 'f8' (expected f32, bf16, f16, f64, i32, i64 or u8) (try --help)")
    expect_line(BENCH, ["--device", "tpu"], "--device: unknown device 'tpu' (cpu or cuda) (try --help)")
    expect_line(BENCH, ["--op", "all_to_all"], "--op all_to_all: unknown (all_gather, reduce_scatter, all_reduce or all)")
    expect_help(BENCH, ["--help"],
                ["Usage: fsdp_bench [OPTIONS]", "-h,--help", "--backend LIST=all", "--op LIST=all",
                 "-b,--minbytes SIZE=1024", "-e,--maxbytes SIZE=67108864", "-f,--stepfactor UINT=2", "-n,--iters INT=20",
                 "-w,--warmup_iters INT=5", "-d,--datatype f32|bf16|f16|f64|i32|i64|u8=f32", "--csv FILE",
                 "--timeout S=60", "--device cpu|cuda=cpu", "Sizes take K, M, G suffixes"])
    # Every spelling of a good command line runs: attached short values, --long=value.
    with tempfile.TemporaryDirectory() as d:
        csv = os.path.join(d, "b.csv")
        p = run(BENCH, ["-b1K", "--maxbytes=2K", "-f", "2", "-n1", "-w", "0", "-d", "bf16", "--op=all_reduce",
                        "--backend", "mpi", f"--csv={csv}", "--timeout", "30"])
        rows = open(csv).read().splitlines() if os.path.exists(csv) else []
        R.check("fsdp_bench -b1K --maxbytes=2K ... --csv=FILE: runs, 2 sizes x (mpi-raw, mpi) in the CSV",
                p.returncode == 0 and len(rows) == 5 and all(",all_reduce," in r and ",bf16," in r for r in rows[1:]),
                f"rc {p.returncode} {p.stderr} rows {rows}")


def ckpt_cases():
    expect_line(CKPT, [], f"no command given: expected {COMMANDS} (try --help)")
    expect_line(CKPT, ["frobnicate", "a"], f"unknown command 'frobnicate': expected {COMMANDS} (try --help)")
    expect_line(CKPT, ["--bogus"], "unknown option '--bogus' (try --help)")
    expect_line(CKPT, ["verify", "a", "--bogus"], "unknown option '--bogus' (try --help)")
    expect_line(CKPT, ["inspect"], "FILE is required (try --help)")
    expect_line(CKPT, ["verify", "a", "b"], "unexpected argument 'b' (try --help)")
    expect_line(CKPT, ["consolidate", "a"], "OUT is required (try --help)")
    expect_line(CKPT, ["export-hf", "a"], "DIR is required (try --help)")
    expect_line(CKPT, ["reshard", "a", "b", "--format", "zip"],
                "--format: zip not in {sharded,consolidated} (try --help)")
    expect_line(CKPT, ["reshard", "a", "b", "--format"],
                "--format: 1 required TEXT:{sharded,consolidated} missing (try --help)")
    expect_line(CKPT, ["export-hf", "a", "b", "--dtype=f64"], "--dtype: f64 not in {f32,bf16,f16} (try --help)")
    expect_line(CKPT, ["export-hf", "a", "b", "--max-shard-size", "12XB"],
                "--max-shard-size '12XB': not a size such as 5GB, 500MB, 2GiB or a positive byte count")
    expect_line(CKPT, ["export-hf", "a", "b", "--max-shard-size", "0"],
                "--max-shard-size '0': not a size such as 5GB, 500MB, 2GiB or a positive byte count")
    expect_line(CKPT, ["inspect", "a", "--max-shard-size", "5GB"], "--max-shard-size goes with export-hf")
    expect_line(CKPT, ["inspect", "a", "--format", "sharded"], "--format goes with reshard")
    expect_line(CKPT, ["--dtype", "bf16", "consolidate", "a", "b"], "--dtype goes with export-hf")
    expect_line(CKPT, ["--force", "verify", "a"], "--force goes with consolidate, reshard or export-hf")
    expect_line(CKPT, ["--force=1", "consolidate", "a", "b"], "force was given a disallowed flag override (try --help)")
    # Options before the command reach it (a missing input is a bad file: exit 1, the loader's line).
    expect_line(CKPT, ["--force", "--format=consolidated", "reshard", "/nonexistent/in.h5", "out.h5"],
                "checkpoint /nonexistent/in.h5: cannot read the file (No such file or directory)", rc=1)
    expect_help(CKPT, ["--help"],
                ["Usage: fsdp_ckpt [OPTIONS] [SUBCOMMAND]", "-h,--help", "--force", "--format TEXT:{sharded,consolidated}",
                 "--dtype TEXT:{f32,bf16,f16}", "--max-shard-size TEXT", "fsdp_app itself loads",
                 *(f"\n  {c} " for c in ("inspect", "verify", "consolidate", "reshard", "export-hf"))])
    expect_help(CKPT, ["reshard", "--help"], ["Usage: fsdp_ckpt reshard [OPTIONS] IN OUT", "IN TEXT REQUIRED",
                                              "OUT TEXT REQUIRED", "write IN (either"])


def mpi_cases():
    """Under mpirun every rank parses; rank 0 alone prints, every rank exits 2."""
    for exe, args, line in ((BENCH, ["-n", "x"], "--iters: expected an integer in [1, 1073741824], got 'x' (try --help)"),
                            (CKPT, ["--bogus"], "unknown option '--bogus' (try --help)")):
        prog = os.path.basename(exe)
        p = run(exe, args, np_=2)
        ours = [l for l in p.stderr.splitlines() if l.startswith(prog)]
        R.check(f"mpirun -np 2 {prog} {' '.join(args)}: one line from rank 0, exit 2",
                p.returncode == 2 and ours == [f"{prog}: {line}"] and p.stdout == "", f"rc {p.returncode} {p.stderr}")
        p = run(exe, ["--help"], np_=2)
        R.check(f"mpirun -np 2 {prog} --help: printed once", p.returncode == 0 and p.stdout == run(exe, ["--help"]).stdout,
                f"rc {p.returncode} {p.stdout}")


def main():
    bench_cases()
    ckpt_cases()
    mpi_cases()
    R.print_counts()
    return R.exit_code()


if __name__ == "__main__":
    sys.exit(main())
