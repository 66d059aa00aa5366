"""`tracekit record`, `tracekit demo-train` and `tracekit testbed ...`: thin over tracekit.capture."""
from __future__ import annotations

import sys

import click

from ._common import echo_err, emit, fail_cleanly, format_option


@click.command("record", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="tracekit-run", show_default=True,
              help="Trace directory that receives every rank's files.")
@click.option("--force", is_flag=True, help="Replace a capture already in --out.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@fail_cleanly
def record_cmd(out_dir, force, command):
    """Run a training command and gather its ranks' traces into one directory.

    The training script must wrap its loop in tracekit.capture.profile() with
    no directory (or out_dir=None): it then writes to the folder that record
    passes in $TRACEKIT_OUT_DIR. Each rank writes rank<R>.trace.json.gz and
    rank<R>.fr.json, rank 0 writes run.json. The command's exit code is
    record's exit code; files written before a failure are kept.

    \b
    Example:
      tracekit record --out runs/job42 -- torchrun --nproc-per-node 4 train.py
      tracekit ingest runs/job42
    """
    from ..capture.record import record

    r = record(list(command), out_dir, force=force)
    echo_err(f"gathered {len(r.gathered)} file(s) into {r.out_dir}: {', '.join(r.gathered) or 'none'}")
    if not any(n.endswith((".trace.json.gz", ".trace.json")) for n in r.gathered):
        echo_err("warning: no rank wrote a trace; does the script use tracekit.capture.profile()?")
    elif "run.json" not in r.gathered:
        echo_err("warning: no run.json (the job did not leave its profile() block on rank 0)")
    for path in r.left_in_staging:
        echo_err(f"warning: kept {path} (another rank's file has the same name)")
    if r.returncode != 0:
        echo_err(f"command exited with code {r.returncode}")
    sys.exit(r.returncode)


def _slow_link(ctx, param, value):
    if value is None:
        return None
    try:
        host, rate = value.split(":")
        return int(host), float(rate)
    except ValueError:
        raise click.BadParameter(f"expected HOST:RATE_MBIT (e.g. 1:50), got {value!r}") from None


def _step_options(timed_steps: int):
    """--steps, --warmup and --timed-steps of a demo job (the profiled, warm-up and unprofiled steps)."""
    def wrap(f):
        f = click.option("--timed-steps", type=click.IntRange(0, 1000), default=timed_steps, show_default=True,
                         help="Unprofiled steps after the profiled ones (timed only, in run.json).")(f)
        f = click.option("--warmup", type=click.IntRange(0, 100), default=1, show_default=True,
                         help="Profiler warm-up steps.")(f)
        return click.option("--steps", type=click.IntRange(1, 100), default=3, show_default=True,
                            help="Profiled steps.")(f)
    return wrap


@click.command("demo-train")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Trace directory to write.")
@click.option("--ranks", type=click.IntRange(1, 64), default=2, show_default=True, help="Data-parallel ranks.")
@_step_options(timed_steps=4)
@click.option("--d-model", type=click.IntRange(8, 4096), default=64, show_default=True, help="Model width.")
@click.option("--layers", type=click.IntRange(1, 64), default=2, show_default=True, help="Transformer layers.")
@click.option("--vocab", type=click.IntRange(16, 1 << 20), default=512, show_default=True, help="Vocabulary size.")
@click.option("--seq-len", type=click.IntRange(1, 8192), default=32, show_default=True, help="Tokens per sample.")
@click.option("--batch-size", type=click.IntRange(1, 4096), default=8, show_default=True, help="Samples per rank.")
@click.option("--bucket-mb", type=click.FloatRange(0.01, 1024), default=25.0, show_default=True,
              help="DDP gradient bucket size in MB.")
@click.option("--slow-rank", type=int, default=None, help="Rank that sleeps in data loading (a straggler).")
@click.option("--slow-ms", type=click.FloatRange(0), default=50.0, show_default=True,
              help="Sleep per step on --slow-rank, in ms.")
@click.option("--hosts", type=click.IntRange(2, 64), default=None,
              help="Run on a testbed of this many network-namespace hosts (needs root and iproute2).")
@click.option("--link-rate-mbit", type=click.FloatRange(0.1), default=None,
              help="Testbed link rate in Mbit/s (default: unshaped).")
@click.option("--slow-link", callback=_slow_link, default=None, metavar="HOST:RATE_MBIT",
              help="Testbed host whose link runs at a lower rate (a slow link).")
@click.option("--link-frames", type=click.Choice(["jumbo", "gso"]), default="jumbo", show_default=True,
              help="Testbed link kind: 9000-byte frames one by one, or 1500-byte frames in GSO/TSO batches.")
@click.option("--link-burst-kb", type=click.FloatRange(1), default=None,
              help="Testbed token-bucket depth in KB (default: two jumbo frames or a GSO batch, and 0.5 / 4 ms of "
                   "traffic).")
@click.option("--seed", type=int, default=0, show_default=True)
@fail_cleanly
def demo_train_cmd(out_dir, ranks, steps, warmup, timed_steps, d_model, layers, vocab, seq_len, batch_size,
                   bucket_mb, slow_rank, slow_ms, hosts, link_rate_mbit, slow_link, link_frames, link_burst_kb, seed):
    """Train a tiny transformer with DDP on gloo (CPU) and capture every rank.

    Ranks run as local processes on loopback, or with --hosts inside network
    namespaces joined by shaped links. Writes rank<R>.trace.json.gz,
    rank<R>.fr.json and run.json into --out. Needs the capture extra.

    \b
    Example:
      tracekit demo-train --out runs/demo --ranks 4
      tracekit demo-train --out runs/straggler --ranks 3 --slow-rank 1 --slow-ms 40
      tracekit demo-train --out runs/net100 --ranks 2 --hosts 2 --link-rate-mbit 100
      tracekit ingest runs/demo
    """
    from ..capture.demo import DemoConfig, run, summarize

    cfg = DemoConfig(out_dir=out_dir, ranks=ranks, steps=steps, warmup=warmup, timed_steps=timed_steps,
                     d_model=d_model, layers=layers, vocab=vocab, seq_len=seq_len, batch_size=batch_size,
                     bucket_mb=bucket_mb, slow_rank=slow_rank, slow_ms=slow_ms if slow_rank is not None else 0.0,
                     hosts=hosts, link_rate_mbit=link_rate_mbit,
                     slow_link_host=slow_link[0] if slow_link else None,
                     slow_link_rate_mbit=slow_link[1] if slow_link else None, link_frames=link_frames,
                     link_burst_bytes=int(link_burst_kb * 1000) if link_burst_kb is not None else None, seed=seed)
    doc = run(cfg)
    click.echo(f"{out_dir}: {summarize(doc)}")


@click.command("demo-layout")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Trace directory to write.")
@click.option("--layout", type=click.Choice(["ddp", "fsdp", "fsdp_noreshard", "tp", "tp_sp", "pp_gpipe", "pp_1f1b",
                                             "fsdp_tp", "dp_pp"]), required=True,
              help="Parallel layout, each from PyTorch's own API (DDP, FSDP2, DTensor TP, pipelining; 2-D on 4 ranks).")
@click.option("--ranks", type=click.IntRange(2, 64), default=2, show_default=True, help="Ranks (4 for a 2-D layout).")
@_step_options(timed_steps=3)
@click.option("--d-model", type=click.IntRange(8, 4096), default=128, show_default=True, help="Model width.")
@click.option("--layers", type=click.IntRange(1, 64), default=4, show_default=True, help="Transformer blocks.")
@click.option("--heads", type=click.IntRange(1, 64), default=4, show_default=True, help="Attention heads.")
@click.option("--vocab", type=click.IntRange(16, 1 << 20), default=512, show_default=True, help="Vocabulary size.")
@click.option("--seq-len", type=click.IntRange(1, 8192), default=64, show_default=True, help="Tokens per sample.")
@click.option("--batch-size", type=click.IntRange(1, 4096), default=8, show_default=True,
              help="Samples per step, the whole job's (data-parallel ranks take their share).")
@click.option("--micro-batches", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Micro-batches per step (pipeline layouts).")
@click.option("--hosts", type=click.IntRange(2, 64), default=None,
              help="Run on a testbed of this many network-namespace hosts (needs root and iproute2).")
@click.option("--link-rate-mbit", type=click.FloatRange(0.1), default=None,
              help="Testbed link rate in Mbit/s (default: unshaped).")
@click.option("--poll-idle", is_flag=True,
              help="Hold the CPUs out of their idle states while the job runs (PM QoS, /dev/cpu_dma_latency): on a "
                   "VM, compute after a wait otherwise runs slower, the more so the slower the links.")
@click.option("--checkpointing", type=click.Choice(["none", "full"]), default="none", show_default=True,
              help="Activation checkpointing: full wraps every block in PyTorch's checkpoint_wrapper (its forward is "
                   "recomputed in the backward).")
@click.option("--profile-memory", is_flag=True, help="Record the allocator's [memory] events (profile_memory=True).")
@click.option("--seed", type=int, default=0, show_default=True)
@fail_cleanly
def demo_layout_cmd(out_dir, layout, ranks, steps, warmup, timed_steps, d_model, layers, heads, vocab, seq_len,
                    batch_size, micro_batches, hosts, link_rate_mbit, poll_idle, checkpointing, profile_memory, seed):
    """Train a small transformer under one parallel layout on gloo (CPU) and capture every rank.

    The same model (attention and MLP blocks) under DDP, FSDP2 (fully_shard per
    block and root, with or without reshard_after_forward), DTensor tensor
    parallelism (parallelize_module, with or without sequence parallelism),
    torch.distributed.pipelining (ScheduleGPipe, Schedule1F1B), and the 2-D
    mixes FSDP x TP and DP x PP on 4 ranks. With --hosts, rank r runs on
    testbed host r // (ranks / hosts).

    \b
    Example:
      tracekit demo-layout --out runs/tp --layout tp --hosts 2 --link-rate-mbit 100
      tracekit demo-layout --out runs/fsdp_tp --layout fsdp_tp --ranks 4 --hosts 2
    """
    from ..capture.layouts import LayoutConfig, run, summarize

    cfg = LayoutConfig(out_dir=out_dir, layout=layout, ranks=ranks, steps=steps, warmup=warmup,
                       timed_steps=timed_steps, d_model=d_model, layers=layers, heads=heads, vocab=vocab,
                       seq_len=seq_len, batch_size=batch_size, micro_batches=micro_batches, hosts=hosts,
                       link_rate_mbit=link_rate_mbit, poll_idle=poll_idle, checkpointing=checkpointing,
                       profile_memory=profile_memory, seed=seed)
    doc = run(cfg)
    click.echo(f"{out_dir}: {summarize(doc)}")


@click.group("testbed")
def testbed_group():
    """A multi-host testbed on this machine: network namespaces joined by shaped links.

    \b
    Example:
      tracekit testbed probe --hosts 2 --rate-mbit 200
      tracekit testbed cleanup
    """


@testbed_group.command("probe")
@click.option("--hosts", type=click.IntRange(2, 64), default=2, show_default=True, help="Hosts (namespaces).")
@click.option("--rate-mbit", "rate_mbit", type=click.FloatRange(0.1), multiple=True, default=(200.0,),
              show_default=True, help="Link rate in Mbit/s; repeat to measure several rates.")
@click.option("--mib", type=click.FloatRange(0.001, 1024), default=4.0, show_default=True,
              help="All-reduce buffer size in MiB.")
@click.option("--iters", type=click.IntRange(1, 100), default=3, show_default=True, help="Timed all-reduces.")
@format_option()
@fail_cleanly
def testbed_probe_cmd(hosts, rate_mbit, mib, iters, fmt):
    """Time gloo all-reduces between testbed hosts against the ring bandwidth model.

    Builds the testbed, measures at each rate, and tears it down. Needs root,
    iproute2 and the capture extra.

    \b
    Example:
      tracekit testbed probe --hosts 2 --rate-mbit 1000 --rate-mbit 200 --mib 4
    """
    from ..capture.allreduce_probe import ring_allreduce_model_s, run_on_testbed
    from ..testbed import Testbed

    nbytes = int(mib * (1 << 20))
    rows = []
    with Testbed(hosts, rate_mbit[0]) as tb:
        for rate in rate_mbit:
            tb.shape(rate)
            times_ns = sorted(run_on_testbed(tb, nbytes, iters=iters))
            median_ms = times_ns[len(times_ns) // 2] / 1e6
            model_ms = ring_allreduce_model_s(nbytes, hosts, rate) * 1e3
            rows.append({"hosts": hosts, "rate_mbit": rate, "bytes": nbytes, "median_ms": round(median_ms, 2),
                         "model_ms": round(model_ms, 2), "ratio": round(median_ms / model_ms, 3)})
    import pandas as pd

    emit(pd.DataFrame(rows), fmt)


@testbed_group.command("cleanup")
@click.option("--all", "all_", is_flag=True, help="Also remove namespaces of testbeds still running.")
@fail_cleanly
def testbed_cleanup_cmd(all_):
    """Remove testbed namespaces left behind by runs that died.

    \b
    Example:
      tracekit testbed cleanup
    """
    from ..testbed import cleanup_stale

    removed = cleanup_stale(include_live=all_)
    click.echo(f"removed {len(removed)} namespace(s){': ' + ', '.join(removed) if removed else ''}")
