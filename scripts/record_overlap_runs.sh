#!/usr/bin/env bash
# Record the overlapping-communication validation runs of the shared-link model on the testbed
# (network namespaces, tc-shaped links; needs root, iproute2 and pip install 'tracekit[capture]').
# Usage: scripts/record_overlap_runs.sh [OUT_DIR]   (default: runs/overlap; not bundled: ~25 MB)
# Record them on a quiet machine: step times are measured, and other work on the cores moves them.
set -euo pipefail
out="${1:-runs/overlap}"
mkdir -p "$out"

# job_a, job_b: the overlap validation's two jobs
source "$(dirname "$0")/overlap_jobs.sh"

# A on 2 hosts at four rates spanning 8x: "links r_b/r_a" between every ordered pair.
for rate in 50 100 200 400; do
  tracekit demo-train --out "$out/a_2hosts_${rate}mbit" --ranks 2 --hosts 2 --link-rate-mbit "$rate" "${job_a[@]}"
done
# B on 2 hosts at two rates.
for rate in 100 400; do
  tracekit demo-train --out "$out/b_2hosts_${rate}mbit" --ranks 2 --hosts 2 --link-rate-mbit "$rate" "${job_b[@]}"
done
# A on 4 hosts (a bridge joins them) at 100 Mbit/s: data parallelism 2 <-> 4.
tracekit demo-train --out "$out/a_4hosts_100mbit" --ranks 4 --hosts 4 --link-rate-mbit 100 "${job_a[@]}"
# A on 2 hosts at 200 Mbit/s with host 1's link 4x slower (50 Mbit/s): a degraded NIC.
tracekit demo-train --out "$out/a_2hosts_200mbit_h1_50mbit" --ranks 2 --hosts 2 --link-rate-mbit 200 \
  --slow-link 1:50 "${job_a[@]}"

for d in "$out"/*/; do
  tracekit ingest "$d" --quiet
done
du -sh "$out"
