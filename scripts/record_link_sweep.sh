#!/usr/bin/env bash
# Record the link-condition sweep of the network model (issue "One network model, right on links unlike the
# testbed's"): the overlap jobs of scripts/record_overlap_runs.sh on links of other kinds, so that the model is
# validated on links it was not shaped for (needs root, iproute2 and pip install 'tracekit[capture]').
#
# Usage: scripts/record_link_sweep.sh [OUT_DIR] [SEED]   (default: runs/sweep, the seed from the clock)
#
# Families (one folder each, <family>/<job>_<H>hosts_<rate>mbit[_h1_<rate>mbit]):
#   gso_256k     1500-byte frames in GSO/TSO batches behind a 256 KB token bucket (cloud NIC burst credits)
#   gso_default  1500-byte frames in GSO/TSO batches behind the kind's default bucket (a batch, 4 ms of traffic)
#   jumbo_512k   9000-byte frames one by one behind a 512 KB bucket
#   drawn        a kind, a bucket depth and rates drawn at random from SEED (printed; after the model is fixed)
# The testbed's own links (9000-byte frames, a two-frame bucket) are runs/overlap (scripts/record_overlap_runs.sh).
# No family adds delay: this machine's kernel has no netem (sch_netem), so RTTs are the namespaces' own.
# Each family: job A at three rates spanning 16x, job B at two, A on 4 hosts (data parallelism 2 <-> 4), and A with
# host 1's link 4x slower than the others. Record on a quiet machine: step times are measured.
set -euo pipefail
out="${1:-runs/sweep}"
seed="${2:-$(date +%s)}"
mkdir -p "$out"

# job_a, job_b: the overlap validation's two jobs
source "$(dirname "$0")/overlap_jobs.sh"

record() {  # family, name, link args..., -- job args...
  local fam="$1" name="$2"; shift 2
  local dir="$out/$fam/$name"
  if [[ -f "$dir/run.json" ]]; then echo "$dir: already recorded"; return; fi
  tracekit demo-train --out "$dir" "$@"
}

family() {  # name, low rate, mid rate, high rate, link args...
  local fam="$1" lo="$2" mid="$3" hi="$4"; shift 4
  local link=("$@")
  for rate in "$lo" "$mid" "$hi"; do
    record "$fam" "a_2hosts_${rate}mbit" --ranks 2 --hosts 2 --link-rate-mbit "$rate" "${link[@]}" "${job_a[@]}"
  done
  for rate in "$lo" "$hi"; do
    record "$fam" "b_2hosts_${rate}mbit" --ranks 2 --hosts 2 --link-rate-mbit "$rate" "${link[@]}" "${job_b[@]}"
  done
  record "$fam" "a_4hosts_${mid}mbit" --ranks 4 --hosts 4 --link-rate-mbit "$mid" "${link[@]}" "${job_a[@]}"
  local slow
  slow=$(python3 -c "print(f'{$mid / 4:g}')")
  record "$fam" "a_2hosts_${mid}mbit_h1_${slow}mbit" --ranks 2 --hosts 2 --link-rate-mbit "$mid" \
    --slow-link "1:$slow" "${link[@]}" "${job_a[@]}"
}

family gso_256k 50 200 800 --link-frames gso --link-burst-kb 256
family gso_default 50 200 800 --link-frames gso
family jumbo_512k 50 200 800 --link-frames jumbo --link-burst-kb 512

# drawn: the kind, the bucket (log-uniform from the kind's smallest to 512 KB) and a lowest rate (50-250 Mbit/s;
# the others 4x and 16x it, capped at 1 Gbit/s)
read -r kind burst_kb lo mid hi < <(python3 - "$seed" <<'EOF'
import math, random, sys
rnd = random.Random(int(sys.argv[1]))
kind = rnd.choice(["jumbo", "gso"])
smallest_kb = {"jumbo": 18.1, "gso": 68.6}[kind]
burst_kb = math.exp(rnd.uniform(math.log(smallest_kb), math.log(512)))
lo = rnd.choice([50, 60, 75, 100, 125, 150, 200, 250])
print(kind, f"{burst_kb:.0f}", lo, min(4 * lo, 1000), min(16 * lo, 1000))
EOF
)
echo "drawn from seed $seed: $kind frames, ${burst_kb} KB bucket, $lo / $mid / $hi Mbit/s" | tee "$out/drawn.txt"
family drawn "$lo" "$mid" "$hi" --link-frames "$kind" --link-burst-kb "$burst_kb"

for d in "$out"/*/*/; do
  tracekit ingest "$d" --quiet
done
du -sh "$out"
