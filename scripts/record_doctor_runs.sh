#!/usr/bin/env bash
# Record the runs `tracekit doctor` is validated on (bench/doctor.py, docs/doctor.md): one job with an
# injected slow rank and the same job without it, one link-bound job at a rate and at twice that rate, and
# an unbalanced 2-stage pipeline with its balanced twin.
# Needs root, iproute2 and pip install 'tracekit[capture]'; record on a quiet machine (step times are measured).
# Usage: scripts/record_doctor_runs.sh [OUT_DIR]   (default: runs/doctor; not bundled)
set -euo pipefail
out="${1:-runs/doctor}"
mkdir -p "$out"
# the bundled samples' model (scripts/make_samples.sh): 3 ranks on loopback, rank 1 sleeping 40 ms per step
# in data loading, and the same job with no slow rank
model=(--d-model 128 --layers 2 --vocab 512 --seq-len 32 --batch-size 8 --steps 6 --warmup 1 --timed-steps 4)
tracekit demo-train --out "$out/straggler" --ranks 3 --slow-rank 1 --slow-ms 40 "${model[@]}"
tracekit demo-train --out "$out/no_straggler" --ranks 3 "${model[@]}"
# a link-bound DDP job (scripts/record_overlap_runs.sh's job A) on 2 hosts at 100 and 200 Mbit/s
job_a=(--d-model 256 --layers 2 --vocab 512 --seq-len 16 --batch-size 2 --bucket-mb 1.25
       --steps 6 --warmup 1 --timed-steps 4)
for rate in 100 200; do
  tracekit demo-train --out "$out/link_bound_${rate}mbit" --ranks 2 --hosts 2 --link-rate-mbit "$rate" "${job_a[@]}"
done
# a 2-stage gloo pipeline (1F1B, 4 micro-batches) with 3 + 1 equal blocks and the same model balanced 2 + 2,
# three takes each, alternating (a loaded machine moves CPU steps by several percent)
for take in 1 2 3; do
  python -m tracekit.capture.pipeline_demo --out "$out/pp_unbalanced_$take" --stage-layers 3,1 --d-model 512 \
    --steps 5 --timed-steps 3
  python -m tracekit.capture.pipeline_demo --out "$out/pp_balanced_$take" --stage-layers 2,2 --d-model 512 \
    --steps 5 --timed-steps 3
done
for d in "$out"/*/; do
  tracekit ingest "$d" --quiet
done
du -sh "$out"
