#!/usr/bin/env bash
# Record the parallel-layout validation runs on the testbed (network namespaces, tc-shaped links; needs root,
# iproute2 and pip install 'tracekit[capture]'): one small transformer (tracekit demo-layout) under every
# layout, each from PyTorch's own API, at several link rates, on 2 hosts and on 4.
# Usage: [REPEATS=N] scripts/record_layout_runs.sh [OUT_DIR] [small|poll|pairs|hosts]   (default: runs/layouts;
#   ~420 MB, not bundled)
#   small: the bundled samples' configuration (sample_traces/layouts)
#   poll:  the full matrix with the CPUs held out of their idle states (tracekit demo-layout --poll-idle): on this
#          VM compute after a wait runs slower the slower the links, which a network what-if cannot know
#   pairs: poll's 1-D layouts on 2 hosts only (the rate pairs; ~60 MB a recording)
#   hosts: poll's 4-rank runs only, on 2 hosts and on 4 (their rate pairs, and 2 <-> 4 hosts)
#   REPEATS=N: record each layout's rates N times over, into OUT_DIR/rep1 .. repN (default 1: into OUT_DIR
#          itself): on a shared VM the CPU speed drifts by tens of percent over minutes, and noise only adds time,
#          so bench/whatif_layouts.py reads the fastest of a run's N recordings as its measurement, and reports
#          each sweep of the rates on its own as well
# Record on a quiet machine: step times are measured, and other work on the cores moves them.
set -euo pipefail
out="${1:-runs/layouts}"
mode="${2:-full}"
mkdir -p "$out"

one_d=(ddp fsdp fsdp_noreshard tp tp_sp pp_gpipe pp_1f1b)
two_d=(fsdp_tp dp_pp)

# a recording whose profiled steps spread by more than 10% (coefficient of variation) was disturbed (another
# process on the two cores, the host): the samples record it again, up to twice
steady() {
  python - "$1" <<'PY'
import json, statistics, sys
doc = json.load(open(sys.argv[1] + "/run.json"))
first = doc["profiler"]["warmup_steps"]
steps = doc["step_times_ns"][first:first + doc["profiler"]["active_steps"]]
sys.exit(0 if statistics.pstdev(steps) <= 0.10 * statistics.mean(steps) else 1)
PY
}
sample() {  # OUT LAYOUT RANKS RATE
  for _try in 1 2 3; do
    tracekit demo-layout --out "$1" --layout "$2" --ranks "$3" --hosts 2 --link-rate-mbit "$4" "${model[@]}"
    steady "$1" && return 0
    echo "$1: profiled steps spread by more than 10%: recorded again" >&2
  done
}

if [ "$mode" = small ]; then
  # The samples bundled in sample_traces/layouts: the same width, two blocks (the events a step writes grow with
  # the blocks, the step time with the width), 4 profiled steps after 2 warm-up ones. FSDP, TP and 1F1B at 100 and
  # 400 Mbit/s, FSDP without resharding, TP with sequence parallelism, GPipe and DP x PP at 100 (DDP's pair is
  # sample_traces/ddp2_2hosts_*; FSDP x TP, 2 MB on 4 ranks, is in the full matrix only). The flight-recorder
  # dumps are kept only where they name the process groups of a 2-D mesh (gloo's trace events do not), without
  # their stack frames (their bulk; nothing reads them).
  # The CPUs are held out of their idle states (--poll-idle): the samples test the network model, not this VM's
  # compute slowing down after waits (the full matrix is recorded both ways).
  model=(--d-model 128 --layers 2 --heads 4 --vocab 512 --seq-len 64 --batch-size 8 --steps 4 --warmup 2 --timed-steps 1
         --poll-idle)
  for l in fsdp tp pp_1f1b; do  # a layout's rates one after another (see the full matrix below)
    for rate in 100 400; do
      sample "$out/${l}_2hosts_${rate}mbit" "$l" 2 "$rate"
    done
  done
  for l in fsdp_noreshard tp_sp pp_gpipe; do
    sample "$out/${l}_2hosts_100mbit" "$l" 2 100
  done
  sample "$out/dp_pp_2hosts_100mbit" dp_pp 4 100
  python - "$out" <<'PY'
import json, pathlib, sys
for f in pathlib.Path(sys.argv[1]).glob("*/rank*.fr.json"):
    if not f.parent.name.startswith(("fsdp_tp", "dp_pp")):
        f.unlink()
        continue
    doc = json.loads(f.read_text())
    for e in doc.get("entries", []):
        e.pop("frames", None)
    f.write_text(json.dumps(doc))
PY
  du -sh "$out"
  exit 0
fi

# 0.92 M parameters (d 128, 4 blocks), 8 x 64 tokens a step, 8 profiled steps (a pipeline's step boundaries jitter:
# the medians need them)
model=(--d-model 128 --layers 4 --heads 4 --vocab 512 --seq-len 64 --batch-size 8 --steps 8 --warmup 2 --timed-steps 1)
if [ "$mode" = poll ] || [ "$mode" = pairs ] || [ "$mode" = hosts ]; then
  model+=(--poll-idle)
fi
repeats="${REPEATS:-1}"
dest() {  # REP: where recording REP of the set goes
  if [ "$repeats" -gt 1 ]; then echo "$out/rep$1"; else echo "$out"; fi
}
# Every 1-D layout on 2 hosts, one rank each, at four rates spanning 8x: "links r_b/r_a" between every ordered pair.
# A layout's runs one after another, so that the runs a pair compares are minutes apart, not the whole matrix: the
# VM's CPU speed drifts on its own over minutes (a fixed loop took 156-249 ms within two), and a replay keeps each
# op's measured time. Repeated, a layout's sweeps of the rates one after another.
for l in "${one_d[@]}"; do
  [ "$mode" = hosts ] && break
  for rep in $(seq 1 "$repeats"); do
    for rate in 50 100 200 400; do
      tracekit demo-layout --out "$(dest "$rep")/${l}_2r_2hosts_${rate}mbit" --layout "$l" --ranks 2 --hosts 2 \
        --link-rate-mbit "$rate" "${model[@]}"
    done
  done
done
# Every layout on 4 ranks, on 2 hosts (two ranks a host: a mesh's inner dimension inside a host) and on 4,
# at two rates 4x apart: the rate pairs on each placement, and 2 <-> 4 hosts between the placements.
for l in "${one_d[@]}" "${two_d[@]}"; do
  [ "$mode" = pairs ] && break
  for rep in $(seq 1 "$repeats"); do
    for hosts in 2 4; do
      for rate in 100 400; do
        tracekit demo-layout --out "$(dest "$rep")/${l}_4r_${hosts}hosts_${rate}mbit" --layout "$l" --ranks 4 \
          --hosts "$hosts" --link-rate-mbit "$rate" "${model[@]}"
      done
    done
  done
done

for d in $(find "$out" -name run.json -printf '%h\n' | sort); do
  tracekit ingest "$d" --quiet
done
du -sh "$out"
