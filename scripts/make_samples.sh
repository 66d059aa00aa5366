#!/usr/bin/env bash
# Regenerate sample_traces/ with tracekit's own demo trainer (real gloo DDP runs on CPU).
# Needs: pip install 'tracekit[capture]'; the testbed sets (c) and (d) also need root and iproute2.
# Usage: scripts/make_samples.sh [OUT_DIR]   (default: sample_traces)
# Step times are measured, so a rerun gives the same shape of results, not the same numbers.
set -euo pipefail
out="${1:-sample_traces}"
mkdir -p "$out"

# One small model for every set, so the sets compare: ~0.53 M params = 2.1 MB of fp32 gradients
# per step, enough to make the 100 Mbit/s links the bottleneck.
model=(--d-model 128 --layers 2 --vocab 512 --seq-len 32 --batch-size 8 --steps 3 --warmup 1 --timed-steps 6)

# (a) 4-rank DDP on loopback.
tracekit demo-train --out "$out/ddp4_loopback" --ranks 4 "${model[@]}"
# (b) 3-rank DDP, rank 1 sleeps 40 ms per step in data loading (a straggler).
tracekit demo-train --out "$out/ddp3_slow_rank1" --ranks 3 --slow-rank 1 --slow-ms 40 "${model[@]}"
# The testbed sets are the what-if ground truth (docs/whatif.md): the same gradients (2.1 MB), a smaller
# per-rank batch so that the runs are communication-bound (4 ranks on a 2-core machine would otherwise
# distort compute), and 6 profiled steps for stable medians.
testbed=(--d-model 128 --layers 2 --vocab 512 --seq-len 16 --batch-size 2 --steps 6 --warmup 1 --timed-steps 6)
# (c) the same 2-host DDP job (one rank per host) at two link rates: "links 4x faster" and back.
for rate in 100 400; do
  tracekit demo-train --out "$out/ddp2_2hosts_${rate}mbit" --ranks 2 --hosts 2 --link-rate-mbit "$rate" "${testbed[@]}"
done
# (d) the same job on 4 hosts (a bridge joins them) at 100 Mbit/s: data parallelism 2 -> 4 and back.
tracekit demo-train --out "$out/ddp4_4hosts_100mbit" --ranks 4 --hosts 4 --link-rate-mbit 100 "${testbed[@]}"

# (e) 2-rank DDP on loopback, 4 layers, each annotated (layer.<i>, backward): the layer structure the
# tensor/pipeline-parallel what-ifs split (replay/pipeline.py).
tracekit demo-train --out "$out/ddp2_layers" --ranks 2 --d-model 128 --layers 4 --vocab 512 --seq-len 32 \
  --batch-size 8 --steps 6 --warmup 1 --timed-steps 4

# (f) memory/: one DDP job on loopback with the allocator's [memory] events, with and without activation
# checkpointing (checkpoint_wrapper on every block): the memory what-ifs predict each from the other.
for ckpt in none full; do
  tracekit demo-layout --out "$out/memory/ddp_ckpt_$ckpt" --layout ddp --ranks 2 --d-model 128 --layers 2 --heads 4 \
    --vocab 512 --seq-len 64 --batch-size 8 --steps 3 --warmup 1 --timed-steps 1 --profile-memory --checkpointing "$ckpt"
  rm -f "$out/memory/ddp_ckpt_$ckpt"/rank*.fr.json
done

# Ingest must find every rank; the store itself is not bundled.
for d in "$out"/*/ "$out"/memory/*/; do
  [ "$d" = "$out/memory/" ] && continue
  tracekit ingest "$d" --store "$(mktemp -d)/store" --quiet
done
du -sh "$out"

