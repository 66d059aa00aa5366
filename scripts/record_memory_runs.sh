#!/usr/bin/env bash
# Record the memory what-if validation runs on the testbed (network namespaces, tc-shaped links; needs root,
# iproute2 and pip install 'tracekit[capture]'): the small transformer of tracekit demo-layout with the allocator's
# [memory] events, with and without full activation checkpointing (PyTorch's checkpoint_wrapper on every block),
# at 1x and 2x the global batch, under every layout of tracekit demo-layout (DDP, FSDP2, DTensor tensor
# parallelism and the two pipeline schedules on 2 ranks; FSDP x TP and DP x PP on 4), on 2 hosts at 400 Mbit/s.
# Every run predicts the others of its layout ("[memory] activation_checkpointing", "[batch] scale"):
# bench/whatif_memory.py; and every other layout's at its batch and checkpointing ("[parallelism]"):
# bench/whatif_relayout.py --memory-only.
# Usage: [LAYOUTS='ddp:2 tp:2'] scripts/record_memory_runs.sh [OUT_DIR [DEMO_LAYOUT_OPTION ...]]   (default:
#   runs/memory; ~150 MB, not bundled); options after OUT_DIR replace the model's below (another model: --d-model 192
#   --layers 6 --heads 6); LAYOUTS: which layouts, each with its ranks (default: all seven); REPEATS=N: record
#   the whole set N times, one set after the other, into OUT_DIR/rep1 .. repN (default 1: into OUT_DIR itself)
# Record on a quiet machine: step times are measured, and other work on the cores moves them. On a shared VM one
# recording's step can differ from the next's by tens of percent; REPEATS gives bench/whatif_memory.py the
# median and the fastest of N recordings of each run, the sets one after the other so that a slow minute moves
# one recording of a run, not all of them.
set -euo pipefail
out="${1:-runs/memory}"
shift $(( $# > 0 ? 1 : 0 ))
mkdir -p "$out"
model=(--d-model 128 --layers 4 --heads 4 --vocab 512 --seq-len 64 --steps 4 --warmup 2 --timed-steps 1 --poll-idle
       --profile-memory)
layouts="${LAYOUTS:-ddp:2 fsdp:2 tp:2 pp_gpipe:2 pp_1f1b:2 fsdp_tp:4 dp_pp:4}"  # layout:ranks
repeats="${REPEATS:-1}"
for rep in $(seq 1 "$repeats"); do
  dest="$out"
  [ "$repeats" -gt 1 ] && dest="$out/rep$rep"
  mkdir -p "$dest"
  for lr in $layouts; do
    layout="${lr%%:*}" ranks="${lr##*:}"
    for batch in 8 16; do
      for ckpt in none full; do
        tracekit demo-layout --out "$dest/${layout}_b${batch}_ckpt_${ckpt}" --layout "$layout" --ranks "$ranks" \
          --hosts 2 --link-rate-mbit 400 --batch-size "$batch" --checkpointing "$ckpt" "${model[@]}" "$@"
      done
    done
  done
done
for d in $(find "$out" -name run.json -printf '%h\n' | sort); do
  tracekit ingest "$d" --quiet
done
du -sh "$out"
