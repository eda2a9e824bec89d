#!/usr/bin/env bash
# fsdp-hpc next to PyTorch 2.x FSDP (not a test, not in CI): the same models, initial weights,
# batches and threads, trained under fsdp_app and under PyTorch on this CPU.
#
#   bash jobs/bench-peer.sh OUT_DIR [--steps N] [--nps "1 2 4"] [--models "transformer mnist_cnn"]
#                           [--threads T] [--repeats R] [--no-fsdp1] [--node-shared] [--build DIR]
#                           [--param-dtype bf16]
#   self-check (~1 minute once the venv exists): bash jobs/bench-peer.sh /tmp/peer --steps 3 --nps 1 --models mnist_cnn
#
# Models (--models: any of transformer, llama, mnist_cnn): input/transformer_bench.yaml's
# transformer (global batch 8 x 256 tokens, AdamW), the small Llama of input/llama_bench.yaml
# (HF's LlamaForCausalLM: hidden 256, 4 decoder layers, 8 query / 4 key-value heads, SwiGLU 688;
# the transformer's batches and optimizer) and the MNIST Net of input/fashion_mnist.yaml (global
# batch 64, Adadelta); the global batch is split over the ranks (strong scaling), so every world
# size trains the same steps and the losses of every run must be the same curve. Shuffle and
# dropout off, no scheduler. Initial weights: the torch twin's (tests/reference/torch_models.py; the Llama's in plain torch, HF's parameter
# names) under torch.manual_seed(1), written to HDF5 and read by both sides (fsdp_app's
# model.init_from). Batches: torch_reference.py's, the ones fsdp_app's sampler gives with shuffle
# off (transformer and llama: the fortunes file's bytes; mnist_cnn: Fashion-MNIST's train set).
# Units: each transformer block / Llama decoder layer (our auto_wrap transformer_layer; PyTorch:
# fully_shard on each, then the root), each mnist_cnn layer.
# Strategies: FULL_SHARD (ours; PyTorch FSDP2 fully_shard) and NO_SHARD (ours; PyTorch DDP, since
# FSDP2 has no NO_SHARD), and FSDP1's FULL_SHARD and NO_SHARD (--no-fsdp1: not); all on gloo for
# PyTorch and on the MPI backend for ours, every rank launched by the same mpirun with T threads.
# --node-shared adds our FULL_SHARD with fsdp.node_shared_params at np > 1 (a row of its own).
# --param-dtype bf16: FULL_SHARD only, ours with fsdp.mixed_precision.param_dtype bf16 (computing
# in it: compute param_dtype) against FSDP2 with MixedPrecisionPolicy(param_dtype=bf16,
# reduce_dtype=f32); the losses are held to jobs/bench_peer_report.py's bf16 tolerance.
#
# PyTorch comes from PyPI into a cached venv (jobs/torch2_venv.sh; the first run downloads
# several GB). fsdp_app and apps/sgemm_peak are compiled in DIR (default build). Each run's
# ranks run under /usr/bin/time, whose maximum RSS (getrusage of each rank) is the peak RSS;
# apps/sgemm_peak runs just before each run (the peak its fraction of peak is taken of).
# OUT_DIR gets table.md (summary and per-step losses), results.json, peer.png and the raw logs
# (OUT_DIR/runs, emptied first).
# --repeats R runs every configuration R times, in rounds (each round all of them, every other
# round in reverse order); a row's step time is the median over all its repeats' timed steps.
# On a shared machine one process's speed is set for its life (placement, the neighbours' load
# of that minute) and moved this CPU's rows by up to 10 points of sgemm peak between runs of the
# same binary: a claim about % of peak wants R >= 3.
# Fails (exit 1) when any run's losses differ from the others beyond the tolerances in
# jobs/bench_peer_report.py.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '5,7p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
case $1 in -h|--help) sed -n '2,38p' "$0"; exit 0 ;; -*) usage ;; esac
out=$1
shift
steps=4 nps="1 2 4" models="transformer mnist_cnn" threads=1 repeats=1 fsdp1=1 shared=0 build=build pdt=f32
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=${2:-}; shift 2 ;;
    --nps) nps=${2:-}; shift 2 ;;
    --models) models=${2:-}; shift 2 ;;
    --threads) threads=${2:-}; shift 2 ;;
    --repeats) repeats=${2:-}; shift 2 ;;
    --no-fsdp1) fsdp1=0; shift ;;
    --node-shared) shared=1; shift ;;
    --build) build=${2:-}; shift 2 ;;
    --param-dtype) pdt=${2:-}; shift 2 ;;
    -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
    *) echo "bench-peer: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done
positive() { case $2 in ''|*[!0-9]*|0) echo "bench-peer: $1 needs a positive integer, got '$2'" >&2; exit 2 ;; esac; }
positive --steps "$steps"
positive --threads "$threads"
positive --repeats "$repeats"
[ "$steps" -ge 2 ] || { echo "bench-peer: --steps needs at least 2 (the first step is not timed)" >&2; exit 2; }
for np in $nps; do positive --nps "$np"; done
for m in $models; do
  case $m in transformer|llama|mnist_cnn) ;; *) echo "bench-peer: --models takes transformer, llama and mnist_cnn, got '$m'" >&2; exit 2 ;; esac
done
for f in /usr/share/games/fortunes/fortunes /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz; do
  [ -r "$f" ] || { echo "bench-peer: $f is missing (bash jobs/install-deps.sh)" >&2; exit 1; }
done
command -v gnuplot >/dev/null || { echo "bench-peer: gnuplot not found (bash jobs/install-deps.sh)" >&2; exit 1; }
# OUT_DIR/runs starts empty: the report reads every run in it, and a run left by an earlier call
# with other --nps or --models would join this call's table and sgemm medians.
rm -rf "$out/runs"
mkdir -p "$out/runs" || { echo "bench-peer: cannot create $out" >&2; exit 1; }
out=$(cd "$out" && pwd)

t0=$(date +%s)
py=$(bash jobs/torch2_venv.sh)
echo "bench-peer: PyTorch venv ready in $(($(date +%s) - t0)) s: $py ($(du -sh "$(dirname "$(dirname "$py")")" | cut -f1))"
bash jobs/build.sh "$build" fsdp_app sgemm_peak || exit 1  # errors shown, with what to do next
app=$build/apps/fsdp_app

ncpu=$(nproc)  # before OMP_NUM_THREADS is set: nproc honours it
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
export MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29517}
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
{
  echo "cpu: $cpu ($ncpu CPUs; $(grep -m1 '^flags' /proc/cpuinfo | grep -ow 'avx512f\|avx2' | sort | tail -n1))"
  echo "cpus: $ncpu"
  echo "loadavg_start: $(cat /proc/loadavg)"
  echo "threads_per_rank: $threads"
  echo "command: bash jobs/bench-peer.sh OUT_DIR --steps $steps --nps \"$nps\" --models \"$models\" --threads $threads --repeats $repeats$([ $fsdp1 = 0 ] && echo ' --no-fsdp1')$([ $shared = 1 ] && echo ' --node-shared')$([ "$pdt" != f32 ] && echo " --param-dtype $pdt")"
  echo "param_dtype: $pdt"
} >"$out/env.txt"
cat "$out/env.txt"

# The sgemm peak at the threads a run of NP ranks can use (NP x T, at most the CPUs), measured
# just before the run into NAME.sgemm: on a shared machine the peak moves with the load (here by
# up to 2x within minutes), and a fraction of a peak measured at another time means little.
sgemm_before() {
  local name=$1 np=$2 t
  t=$((np * threads)); [ "$t" -le "$ncpu" ] || t=$ncpu
  timeout 300 "$build/apps/sgemm_peak" --threads "$t" --size 2048 --reps 5 >"$out/runs/$name.sgemm"
}

# One run of NP ranks, each under /usr/bin/time (maximum RSS in KiB into NAME.rss.RANK).
launch() {
  local name=$1 np=$2
  shift 2
  MASTER_PORT=$((MASTER_PORT + 1))  # a fresh gloo rendezvous port per run (no TIME_WAIT clash)
  sgemm_before "$name" "$np"
  # shellcheck disable=SC2016  # $0 and $OMPI_COMM_WORLD_RANK expand in each rank's bash, not here
  timeout 1800 mpirun -np "$np" --bind-to none \
    bash -c 'exec /usr/bin/time -f %M -o "$0.rss.$OMPI_COMM_WORLD_RANK" "$@"' "$out/runs/$name" "$@" \
    >"$out/runs/$name.log" 2>&1 || {
    tail -n 20 "$out/runs/$name.log" >&2
    echo "bench-peer: run $name failed (log $out/runs/$name.log)" >&2
    exit 1
  }
}

# Every run of a round as "model np kind" lines, in the order of the first round.
for model in $models; do
  "$py" tests/reference/torch_peer.py --model "$model" --write-init "$out/runs/${model}_init.h5"
done
plan=()
for model in $models; do
  for np in $nps; do
    kinds=(ours_FULL_SHARD ours_NO_SHARD torch_fsdp2 torch_ddp)
    [ $shared = 1 ] && [ "$np" -gt 1 ] && kinds=(ours_FULL_SHARD ours_FULL_SHARD_shared ours_NO_SHARD torch_fsdp2 torch_ddp)
    [ $fsdp1 = 1 ] && kinds+=(torch_fsdp1_full torch_fsdp1_no)
    [ "$pdt" != f32 ] && kinds=(ours_FULL_SHARD torch_fsdp2)  # DDP and FSDP1 rows: f32 only
    for kind in "${kinds[@]}"; do plan+=("$model $np $kind"); done
  done
done

run_one() {  # MODEL NP KIND SUFFIX
  local model=$1 np=$2 kind=$3 name=${1}_np${2}_${3}$4 batch ours
  if [ "$model" = transformer ] || [ "$model" = llama ]; then
    batch=8
    ours=("input/${model}_bench.yaml" --set train.global_batch_size="$batch"
      --set data.path=/usr/share/games/fortunes/fortunes)
  else
    batch=64
    ours=(input/fashion_mnist.yaml --set train.global_batch_size="$batch")
  fi
  ours+=(--set train.steps="$steps" --set train.threads="$threads" --set train.shuffle=false
    --set train.dropout=false --set train.scheduler.kind=none --set train.eval_every=never
    --set model.init_from="$out/runs/${model}_init.h5" --set comm.backend=mpi --set output.log_every=1
    --set fsdp.mixed_precision.param_dtype="$pdt")
  echo "-- $name"
  case $kind in
    ours_FULL_SHARD_shared)
      launch "$name" "$np" "$app" "${ours[@]}" --set fsdp.sharding_strategy=FULL_SHARD \
        --set fsdp.node_shared_params=true --set output.metrics="$out/runs/$name.jsonl" ;;
    ours_*)
      launch "$name" "$np" "$app" "${ours[@]}" --set fsdp.sharding_strategy="${kind#ours_}" \
        --set output.metrics="$out/runs/$name.jsonl" ;;
    torch_*)
      launch "$name" "$np" "$py" tests/reference/torch_peer.py --model "$model" --mode "${kind#torch_}" \
        --init "$out/runs/${model}_init.h5" --steps "$steps" --global-batch $batch --threads "$threads" \
        --out "$out/runs/$name.json" --param-dtype "$pdt" ;;
  esac
}

for ((round = 1; round <= repeats; round++)); do
  suffix=; [ "$round" -gt 1 ] && suffix="~r$round"
  if ((round % 2)); then order=("${plan[@]}"); else order=(); for ((i = ${#plan[@]} - 1; i >= 0; i--)); do order+=("${plan[i]}"); done; fi
  for entry in "${order[@]}"; do
    # shellcheck disable=SC2086  # "model np kind": three words
    run_one $entry "$suffix"
  done
done
echo "loadavg_end: $(cat /proc/loadavg)" >>"$out/env.txt"

/usr/bin/python3 jobs/bench_peer_report.py "$out"
