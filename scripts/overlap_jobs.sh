# The overlap validation's two jobs (sourced by scripts/record_overlap_runs.sh and scripts/record_link_sweep.sh).
# Job A: ~1.84 M params = 7.4 MB of fp32 gradients in 1.25 MB DDP buckets (6 or more per step), gloo's
# default two worker threads, so several all-reduces share a host's link at once. A small per-rank batch
# keeps the runs communication-bound on a 2-core machine.
job_a=(--d-model 256 --layers 2 --vocab 512 --seq-len 16 --batch-size 2 --bucket-mb 1.25
       --steps 6 --warmup 1 --timed-steps 4)
# Job B: another model and bucket size (~1.5 M params in 0.5 MB buckets).
job_b=(--d-model 192 --layers 3 --vocab 512 --seq-len 16 --batch-size 2 --bucket-mb 0.5
       --steps 6 --warmup 1 --timed-steps 4)
