"""What slows a job: one detector per kind of finding, each reading the analyses for its evidence and
writing the scenario that models its fix (None where the replay cannot model it).

A detector returns Candidate rows; tracekit.doctor replays their scenarios and ranks them. Thresholds
below decide only whether a finding is worth stating; the saving is always the replay's.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

# a finding is stated when its share of the step reaches this (below it the fix is not worth a line)
MIN_SHARE_PCT = 5.0
HEADROOM_MAX_SCALE = 64.0  # memory_headroom: the largest global-batch scale it tries
ROOFLINE_TARGET_PCT = 70.0  # low_mfu: the share of their roofline bound GEMMs / attention are brought to
LOW_MFU_PCT = 50.0  # ... when below this share


@dataclass
class Candidate:
    kind: str
    rank: int | None
    title: str
    evidence: list[dict]
    fix: str
    scenario: dict | None  # the what-if document, None: the fix is not predicted
    confidence: str
    assumptions: str
    share_pct: float = 0.0  # the evidence's share of the step, for the order of unpredicted findings
    extra: dict = field(default_factory=dict)
    variant: str = ""  # a second finding of the same kind and rank: its name's suffix


def _ev(analysis: str, figure: str) -> dict:
    return {"analysis": analysis, "figure": figure}


def _ms(ns) -> str:
    return f"{float(ns) / 1e6:.1f} ms"


def pipeline_stages(run) -> dict[int, int] | None:
    """rank -> pipeline stage of a pipeline-parallel job, None for any other job. From run.json's parallel
    block when it says pp > 1: its `stages` list when it has one (tracekit's pipeline demo writes it), else
    Megatron's default order (pipeline outermost: stage = rank // (world / pp)). Without run.json, from the
    traces' distributedInfo: a process group described as a pipeline group (Megatron's
    PIPELINE_MODEL_PARALLEL_GROUP) holds one rank per stage, in stage order."""
    from replay.parallelism import layout

    from ..errors import TracekitError

    par = run.run_manifest().get("parallel") or {}
    try:
        lay = layout(run)
        pp = int(lay.get("pp") or 1) if lay else 1
        given = par.get("stages")
        if pp >= 2 and isinstance(given, list) and len(given) == pp and all(isinstance(x, list) for x in given):
            return {int(r): s for s, ranks in enumerate(given) for r in ranks}
    except (TypeError, ValueError):
        raise TracekitError(f"run.json: the parallel block's degrees and stages must be integers, got {par!r}") from None
    if pp < 2:
        return None if par.get("dp") else _stages_from_process_groups(run)
    ranks = [int(r) for r in run.sql("SELECT rank FROM ranks ORDER BY rank")["rank"]]
    world = int(lay.get("dp", 1)) * int(lay.get("tp", 1)) * pp
    if world != len(ranks) or world % pp:
        return None  # the traces are not the whole job: which rank is in which stage cannot be told
    return {r: r // (world // pp) for r in ranks}


def _stages_from_process_groups(run) -> dict[int, int] | None:
    """rank -> stage from the pipeline process groups the traces' distributedInfo names (pg_desc containing
    'pipeline', as Megatron's PIPELINE_MODEL_PARALLEL_GROUP; embedding groups left out): a rank's stage is
    its place in its pipeline group. None when no trace names one, or the groups disagree."""
    from analyses.comms import process_group_configs

    out = {}
    for groups, _ in process_group_configs(run):
        for g in groups if isinstance(groups, list) else []:
            desc = str(g.get("pg_desc", "")) if isinstance(g, dict) else ""
            ranks = g.get("ranks") if isinstance(g, dict) else None
            if "pipeline" not in desc.lower() or "embedding" in desc.lower() or not isinstance(ranks, list):
                continue
            if len(ranks) < 2:
                continue
            for s_, x in enumerate(ranks):
                if out.setdefault(int(x), s_) != s_:
                    return None
    return out or None


def _per_rank_step(run):
    """Per rank: median step time and median communication time per step (exposed_comm's per-rank figures, the
    ones `tracekit whatif` quotes); a rank without steps or collectives there: its ProfilerStep median, else its
    whole span as one step."""
    from analyses.exposed_comm import exposed_comm_per_rank

    ec = run.analyze("exposed_comm")
    per = {int(row.rank): {"step_ns": float(row.step_ns), "comm_ns": float(row.comm_ns),
                           "exposed_ns": float(row.exposed_comm_ns), "steps": int(row.steps)}
           for row in exposed_comm_per_rank(ec).itertuples() if not np.isnan(row.step_ns)}
    st = run.sql("""SELECT r.rank, coalesce(median(s.dur_ns), any_value(r.last_end_ns - r.first_ts_ns)) AS step_ns,
                           greatest(count(s.dur_ns), 1) AS steps
                    FROM ranks r LEFT JOIN steps s ON s.rank = r.rank AND NOT s.is_last GROUP BY r.rank""")
    for r, step_ns, n in zip(st["rank"], st.step_ns, st.steps):
        if int(r) not in per and step_ns is not None and step_ns > 0:
            per[int(r)] = {"step_ns": float(step_ns), "comm_ns": 0.0, "exposed_ns": 0.0, "steps": int(n)}
    return ec, per


def straggler(run, ctx) -> list[Candidate]:
    sa = run.analyze("straggler_attribution")
    if sa.empty or not sa.consistently_late.fillna(False).any():
        return []
    _, per = ctx["per_rank"]
    if len(per) < 2:
        return []
    late = sa[sa.consistently_late.fillna(False)].sort_values("caused_wait_ns", ascending=False)
    # a rank's own work per step: its step less the time it spent in collectives; the late ranks are brought
    # to the median of the others (all of them at once: with two late ranks, fixing one saves nothing)
    work = {k: v["step_ns"] - v["comm_ns"] for k, v in per.items()}
    stage = ctx.get("stages")
    if stage:
        # in a pipeline the stages do different work: a rank is a straggler only against its own stage's
        # ranks (a whole stage that is slower is pipeline_imbalance's finding)
        late = late[[any(stage.get(k) == stage.get(int(r)) and k != int(r) and k not in set(late["rank"].astype(int))
                         for k in work) for r in late["rank"]]]
        if late.empty:
            return []
        work = {k: w for k, w in work.items() if stage.get(k) == stage.get(int(late["rank"].iloc[0]))}
    on_time = [w for k, w in work.items() if k not in set(late["rank"].astype(int))]
    if not on_time:
        return []
    others = float(np.median(on_time))
    rows = [row for row in late.itertuples() if int(row.rank) in work and work[int(row.rank)] > others > 0]
    if not rows:
        return []
    ranks = [int(row.rank) for row in rows]
    factor = {r: others / work[r] for r in ranks}
    worst = ranks[0]
    evidence = []
    for row in rows:
        r = int(row.rank)
        evidence += [_ev("straggler_attribution", f"rank {r} arrived last at {int(row.late_count)} of "
                         f"{int(row.collectives)} collectives ({100 * row.late_share:.0f}%), {_ms(row.avg_delay_ns)} "
                         f"late on average, causing {_ms(row.caused_wait_ns)} of the others' waiting"),
                     _ev("exposed_comm", f"rank {r} works {_ms(work[r])} per step outside collectives, the "
                         f"on-time ranks' median {_ms(others)} ({_ms(work[r] - others)} more)")]
    who = f"rank {worst}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in sorted(ranks))
    first = rows[0]
    title = (f"rank {worst} is late at {int(first.late_count)} of {int(first.collectives)} collectives; the others "
             "wait for it" if len(ranks) == 1 else f"{who} are late at collectives; the others wait for them")
    return [Candidate(
        kind="straggler", rank=worst if len(ranks) == 1 else None, title=title, evidence=evidence,
        fix=f"find what {who} do{'es' if len(ranks) == 1 else ''} that the others do not (data loading, a slower "
            "host or GPU, extra work, late launches) and remove it",
        scenario={"compute": {"rank_slowdown": {str(r): round(factor[r], 4) for r in sorted(ranks)}}},
        confidence="high",
        assumptions=f"{who}'s work (compute and the gaps between it) scaled to the on-time ranks' median ("
                    + ", ".join(f"rank {r} x{factor[r]:.3f}" for r in sorted(ranks))
                    + "); communication and the other ranks unchanged",
        share_pct=100.0 * (work[worst] - others) / max(per[worst]["step_ns"], 1.0))]


def exposed_communication(run, ctx) -> list[Candidate]:
    _, per = ctx["per_rank"]
    if not per:
        return []
    r, v = max(per.items(), key=lambda kv: kv[1]["exposed_ns"])
    share = 100.0 * v["exposed_ns"] / max(v["step_ns"], 1.0)
    if share < MIN_SHARE_PCT:
        return []
    co = run.analyze("collectives")
    sized = int(co["bytes"].notna().sum()) if len(co) else 0
    if not sized:  # the links model keeps every unsized collective's measured transfer: nothing to predict
        scenario, confidence = None, "medium"
        assumes = (f"not predicted: none of the {len(co)} collective rows carries a byte count (collectives), so "
                   "no link model can re-time them")
    else:
        scenario, confidence = {"network": {"bandwidth_scale": 2.0}}, "high"
        assumes = ("every link twice as fast, shared by the concurrent collectives as the links model fits them on "
                   "this run (docs/whatif.md's validation, every parallel layout); compute unchanged"
                   + (f"; {len(co) - sized} of {len(co)} collective rows carry no byte count and keep their "
                      "measured transfer" if sized < len(co) else ""))
    out = [Candidate(
        kind="exposed_communication", rank=None,
        title=f"{share:.0f}% of the step is communication nothing else overlaps",
        evidence=[_ev("exposed_comm", f"rank {r}: {_ms(v['exposed_ns'])} of exposed communication per step "
                      f"({share:.1f}% of its {_ms(v['step_ns'])} step, median over {v['steps']} step(s)), of "
                      f"{_ms(v['comm_ns'])} in collectives")],
        fix="faster links (the scenario: twice the bandwidth), fewer or larger collectives (DDP bucket_cap_mb), "
            "or more overlap with compute (start gradient all-reduces earlier, FSDP prefetch)",
        scenario=scenario, confidence=confidence, assumptions=assumes, share_pct=share)]
    late = _gradient_collectives_after_backward(run, r)
    if late is not None:
        n, total, bw_ns, gap_ns = late
        out.append(Candidate(
            kind="exposed_communication", rank=r, variant="overlap",
            title=f"rank {r}'s gradient collectives all start after its backward has computed every gradient",
            evidence=[_ev("backward_collectives", f"rank {r}: {n} of {total} gradient all-reduce / reduce-scatter "
                          f"call(s) per step issued after the last backward operator without a collective in it ended (median step); "
                          f"the backward's compute took {_ms(bw_ns)}, the first call came {_ms(gap_ns)} after it"),
                      out[0].evidence[0]],
            fix="start the gradient collectives during backward: smaller DDP buckets (bucket_cap_mb below the "
                "gradients' size, so the first buckets go while later layers still compute), or FSDP / ZeRO, whose "
                "reduce-scatters run per layer",
            scenario=None, confidence="medium",
            assumptions="not predicted: no scenario key issues a collective earlier than the trace's dependencies "
                        "let it (the replay keeps every call behind the work its thread did before it); at most "
                        f"the backward's {_ms(bw_ns)} could hide the communication",
            share_pct=share))
    return out


def _gradient_collectives_after_backward(run, r: int):
    """(calls after the backward's compute, calls in the backward, backward compute ns, gap ns) of rank r's
    median step when every gradient all-reduce / reduce-scatter of the step was issued after the backward had
    computed its gradients: after the end of the last autograd operator that issued no collective; None
    otherwise (some went during the backward, or the trace shows no backward)."""
    df = run.analyze("backward_collectives", rank=int(r))
    if df.empty:
        return None
    n, total, bw, gap = (float(np.median(df[c])) for c in ("calls_after_backward", "gradient_calls", "backward_ns",
                                                            "gap_ns"))
    if n < total or bw <= 0:
        return None
    return int(n), int(total), bw, gap


def host_bound(run, ctx) -> list[Candidate]:
    it = run.analyze("idle_time_breakdown")
    if it.empty:
        return []
    _, per = ctx["per_rank"]
    # each rank's compute stream (the one with the most ops; a communication stream's gaps wait for the
    # collectives' launches, which is the collectives' story)
    main = it.sort_values(["rank", "op_count"], ascending=[True, False]).drop_duplicates("rank")
    by_rank = main.set_index("rank").host_wait_ns
    r = int(by_rank.idxmax())
    steps = max(per.get(r, {}).get("steps", 1), 1)
    step_ns = per.get(r, {}).get("step_ns") or 0
    wait = float(by_rank.max()) / steps
    share = 100.0 * wait / step_ns if step_ns else 0.0
    if share < MIN_SHARE_PCT:
        return []
    return [Candidate(
        kind="host_bound", rank=r,
        title=f"rank {r}'s GPU waits {share:.0f}% of the step for the host to launch work",
        evidence=[_ev("idle_time_breakdown", f"rank {r}, stream {int(main.set_index('rank').stream[r])}: {_ms(wait)} "
                      f"per step of GPU idle time whose next op was "
                      f"launched only after the previous one ended (host wait), {share:.1f}% of its step")],
        fix="less host work per launch: CUDA graphs, torch.compile, fused optimizers, fewer small ops; or a faster host",
        scenario={"compute": {"cpu_scale": 2.0}},
        confidence="medium",
        assumptions="every CPU op and runtime call twice as fast (a faster host, or half the launch overhead); "
                    "GPU work unchanged",
        share_pct=share)]


def data_loading(run, ctx) -> list[Candidate]:
    dl = run.analyze("data_loading")
    _, per = ctx["per_rank"]
    out = []
    for row in dl.sort_values("data_loading_ns", ascending=False, kind="stable").head(1).itertuples():
        r = int(row.rank)
        v = per.get(r)
        if not v:
            continue
        ns = float(row.data_loading_ns) / max(v["steps"], 1)
        share = 100.0 * ns / max(v["step_ns"], 1.0)
        if share < MIN_SHARE_PCT:
            continue
        out.append(Candidate(
            kind="data_loading", rank=r,
            title=f"rank {r} spends {share:.0f}% of the step loading data",
            evidence=[_ev("data_loading", f"rank {r}: {_ms(ns)} per step in data loading ({int(row.spans)} spans), "
                          f"{share:.1f}% of its {_ms(v['step_ns'])} step")],
            fix="DataLoader workers (num_workers), pin_memory and prefetching, so batches are ready before the step asks",
            scenario=None, confidence="medium",
            assumptions="not predicted: the replay has no model of a CPU op made faster by name",
            share_pct=share))
    return out


def sync_stalls(run, ctx) -> list[Candidate]:
    df = run.analyze("sync_calls")
    if df.empty:
        return []
    _, per = ctx["per_rank"]
    tot = df.groupby("rank").total_ns.sum()
    r = int(tot.idxmax())
    v = per.get(r)
    if not v:
        return []
    ns = float(tot.max()) / max(v["steps"], 1)
    share = 100.0 * ns / max(v["step_ns"], 1.0)
    if share < MIN_SHARE_PCT:
        return []
    parts = df[df["rank"] == r].sort_values("total_ns", ascending=False, kind="stable")
    return [Candidate(
        kind="sync_stalls", rank=r, title=f"rank {r} blocks {share:.0f}% of the step in synchronising calls",
        evidence=[_ev("sync_calls", f"rank {r}: " + ", ".join(f"{p.name} {int(p.calls)}x {_ms(p.total_ns)}"
                                                          for p in parts.itertuples())
                      + f"; {_ms(ns)} per step, {share:.1f}% of its step")],
        fix="remove host-device syncs from the step: .item() / .cpu() / printing losses every step, "
            "torch.cuda.synchronize() outside profiling",
        scenario=None, confidence="medium",
        assumptions="not predicted: the time after a sync is the GPU's, and removing the sync changes what the "
                    "host may launch ahead, which the trace does not show", share_pct=share)]


def small_kernels(run, ctx) -> list[Candidate]:
    from analyses.small_kernels import SMALL_KERNEL_NS

    df = run.analyze("small_kernels")
    if df.empty:
        return []
    _, per = ctx["per_rank"]
    row = df.sort_values("small_kernels", ascending=False, kind="stable").iloc[0]
    r = int(row["rank"])
    v = per.get(r)
    if not v or row.small_pct < 50.0:
        return []
    n_step = float(row.small_kernels) / max(v["steps"], 1)
    under = f"{SMALL_KERNEL_NS / 1000:g} us"
    return [Candidate(
        kind="small_kernels", rank=r, title=f"{row.small_pct:.0f}% of rank {r}'s kernels run under {under}",
        evidence=[_ev("small_kernels", f"rank {r}: {int(row.small_kernels)} of {int(row.kernels)} kernels shorter "
                      f"than {under} ({n_step:.0f} per step, {_ms(row.small_kernel_ns)} of {_ms(row.kernel_ns)} "
                      "kernel time)")],
        fix="fuse them (torch.compile, fused optimizers and norms) so their launches and memory round trips go",
        scenario=None, confidence="low",
        assumptions="not predicted: what a fused kernel costs needs each op's bytes moved", share_pct=row.small_pct)]


def _device_memory(run, ctx):
    """memory_peak's rows for the memory a rank can run out of, with their device's capacity (analyses.devices:
    the trace's deviceProperties, else the catalog's for --device or the named GPU): the accelerators' rows
    (device_type other than CPU); on a run without any (a CPU run standing in for a GPU job, as the project's
    recorded ones), the CPU's, which only --device gives a capacity. Rows without a known capacity are dropped;
    (None, None) without [memory] events."""
    if "device_memory" in ctx:  # oom_risk and memory_headroom both judge by it: read once a doctor run
        mp, caps = ctx["device_memory"]
        return (None if mp is None else mp.copy()), caps
    from analyses.devices import memory_capacities
    from analyses.memory import memory_limiting_devices

    mp = run.analyze("memory_peak")
    if mp.empty:
        ctx["device_memory"] = (None, None)
        return None, None
    mp = memory_limiting_devices(mp)
    keys = [(int(r), int(d)) for r, d in zip(mp["rank"], mp.device_id)]
    caps = memory_capacities(run, keys, ctx.get("device"))
    mp = mp[[k in caps for k in keys]].copy()
    mp["capacity_bytes"] = [caps[(int(r), int(d))][0] for r, d in zip(mp["rank"], mp.device_id)]
    ctx["device_memory"] = (mp, caps)
    return mp.copy(), caps


def oom_risk(run, ctx) -> list[Candidate]:
    from analyses.devices import DEFAULT_MEMORY_RESERVE_PCT, fit_verdict, gib

    mp, caps = _device_memory(run, ctx)
    if mp is None or mp.empty:
        return []
    mp["verdict"] = [fit_verdict(float(p), float(c)) for p, c in zip(mp.peak_allocated_bytes, mp.capacity_bytes)]
    risky = mp[[v[0] is False for v in mp.verdict]]
    if risky.empty:
        return []
    risky = risky.assign(used=risky.peak_allocated_bytes / risky.capacity_bytes).sort_values("used", ascending=False,
                                                                                              kind="stable")
    row = risky.iloc[0]
    r, dev_id, cap = int(row["rank"]), int(row.device_id), float(row.capacity_bytes)
    peak, reserved = float(row.peak_allocated_bytes), float(row.peak_reserved_bytes or 0)
    over = peak > cap
    figure = (f"rank {r} device {dev_id}: peak allocated {gib(peak)} ({100 * peak / cap:.1f}% of {gib(cap)}, "
              f"{caps[(r, dev_id)][1]}); {row.verdict[1]}")
    if reserved > peak:  # what the caching allocator holds from the device: the nearer figure to an OOM
        figure += (f"; peak reserved {gib(reserved)} is nearer still ({100 * reserved / cap:.1f}%: the caching "
                   "allocator holds it from the device)")
    others = sorted(int(x) for x in risky["rank"].iloc[1:].unique() if int(x) != r)
    if others:
        figure += f"; also within the reserve or above: rank{'s' if len(others) > 1 else ''} " + \
                  ", ".join(str(x) for x in others)
    return [Candidate(
        kind="oom_risk", rank=r,
        title=(f"rank {r}'s memory peak is {gib(peak - cap)} above its device's {gib(cap)}" if over else
               f"rank {r}'s memory peak leaves {gib(cap - peak)} of its device's {gib(cap)} free, less than the "
               f"{DEFAULT_MEMORY_RESERVE_PCT:g}% reserve: out-of-memory risk"),
        evidence=[_ev("memory_peak", figure)],
        fix="lower the peak: activation checkpointing, a smaller micro-batch (gradient accumulation keeps the global "
            "batch), the optimizer state and gradients sharded (ZeRO, FSDP) or the optimizer offloaded to the host; "
            "where reserved runs far above allocated, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        scenario=None, confidence="medium",
        assumptions=f"not predicted: a statement about the measured peak. The {DEFAULT_MEMORY_RESERVE_PCT:g}% "
                    "reserve stands for what the allocator's count leaves out (the CUDA context, NCCL's buffers, "
                    "fragmentation); a run that holds less of those has more room",
        share_pct=0.0)]


def memory_headroom(run, ctx) -> list[Candidate]:
    """The largest global-batch scale whose predicted peak still fits the device (fit_verdict), by the memory
    what-if ([batch] scale): 2, 4, 8, ... up to HEADROOM_MAX_SCALE while it fits; 1.5 when 2 does not."""
    from analyses.devices import DEFAULT_MEMORY_RESERVE_PCT, fit_verdict, gib
    from replay.checks import ScenarioError
    from replay.memory import predict_peak
    from replay.scenario import scenario_from_dict
    from replay.whatif import whatif

    mp, caps = _device_memory(run, ctx)
    if mp is None or mp.empty:
        return []
    cap = float(mp.capacity_bytes.min())  # the what-if's peak is the job's worst rank's: the smallest device bounds it

    def trial(scale):
        sc = scenario_from_dict({"name": f"batch_x{scale:g}", "batch": {"scale": scale}}, "<memory_headroom>")
        try:
            table = whatif(run, [sc])
        except ScenarioError:  # the trace cannot re-time a batch (no input shapes): no throughput to state
            return None, None
        row = table[table.scenario == sc.name].iloc[0]
        dev = row.get("device_memory_bytes")
        capacity = cap if dev is None or _isna(dev) else float(dev)  # NULL (a CPU run): doctor's, from --device
        return fit_verdict(float(row.predicted_peak_alloc_bytes), capacity)[0], (scale, row, capacity, table)

    read = {}  # the memory analyses the search reads, once for all the scales it tries

    def peak_fits(scale):  # the what-if's peak rule without its replay: the search replays only the scale it keeps
        sc = scenario_from_dict({"name": "s", "batch": {"scale": scale}}, "<memory_headroom>")
        peaks = predict_peak(run, None, None, sc, cache=read)
        return bool(len(peaks)) and fit_verdict(float(peaks.predicted_peak_alloc_bytes.max()), cap)[0]

    scales = [s for s in (2.0 ** k for k in range(1, 64)) if s <= HEADROOM_MAX_SCALE]
    fitting = [s for s in scales if peak_fits(s)]
    failed = next((s for s in scales if s not in fitting), None)
    best = None
    for scale in sorted([s for s in fitting if failed is None or s < failed] or [1.5], reverse=True):
        fits, tried = trial(scale)
        if fits is None:
            return []
        if fits:
            best = tried
            break
        failed = scale
    if best is None:
        return []  # not even 1.5x: oom_risk says whether the measured batch itself is at risk
    scale, row, capacity, table = best
    measured = table[table.scenario == "measured"].iloc[0]
    worst = mp.sort_values("peak_allocated_bytes", ascending=False, kind="stable").iloc[0]
    r, dev_id = int(worst["rank"]), int(worst.device_id)
    tput, tput0 = row.throughput_samples_per_s, measured.throughput_samples_per_s
    known = not (_isna(tput) or _isna(tput0)) and tput0 > 0
    gain = (f"{tput:.1f} samples/s predicted against {tput0:.1f} measured ({100 * (tput / tput0 - 1):+.0f}%)"
            if known else "its throughput is not known (run.json gives no global batch size)")
    upper = (f"; {failed:g}x does not fit" if failed is not None else
             f"; the largest tried ({HEADROOM_MAX_SCALE:g}x)" if scale >= 2 else "")
    return [Candidate(
        kind="memory_headroom", rank=None,
        title=f"the job's memory fits {scale:g}x its global batch: {gain}",
        evidence=[_ev("memory_peak", f"rank {r} device {dev_id}: peak allocated {gib(worst.peak_allocated_bytes)}"
                      + (f", reserved {gib(worst.peak_reserved_bytes)}" if worst.peak_reserved_bytes else "")
                      + f" of {gib(caps[(r, dev_id)][0])} ({caps[(r, dev_id)][1]}), the job's largest")],
        fix=f"a {scale:g}x larger global batch (a larger micro-batch per rank; the learning rate retuned for it)",
        scenario=None, confidence="medium",
        assumptions=f"the memory what-if under [batch] scale = {scale:g}: its worst rank's predicted peak "
                    f"{gib(row.predicted_peak_alloc_bytes)} leaves the {DEFAULT_MEMORY_RESERVE_PCT:g}% reserve of "
                    f"{gib(capacity)} free{upper}. Not ranked by step time, which a larger batch lengthens: "
                    f"`tracekit whatif TRACE_DIR` with [batch] scale = {scale:g} reproduces the figures",
        share_pct=0.0)]


def _isna(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _roofline_and_mfu(run, ranks, device, keep_ops: bool):
    """One chunk of ranks' roofline and MFU from one op table (op_table_with_kernels), and the table itself when
    keep_ops (a chunk's table is dropped once read: every chunk's at once would be the whole store's)."""
    from analyses.flops import mfu, op_table_with_kernels, roofline

    ops, kern = op_table_with_kernels(run)
    return roofline(run, device=device, ops=ops), mfu(run, device=device, ops=ops), (ops, kern) if keep_ops else None


def _op_table(run, ranks):
    from analyses.flops import op_table_with_kernels

    return op_table_with_kernels(run)


def low_mfu(run, ctx) -> list[Candidate]:
    from analyses import per_rank
    from analyses._sql import has_gpu_ops

    if ctx.get("device") is None and not has_gpu_ops(run):
        return []  # a roofline needs kernel time: no rank has any (and no --device to check against the catalog)
    # the op table (every leaf op's shapes, parsed in Python) a chunk of ranks at a time: the roofline and the MFU
    # of a rank are its own ops'; the table of 16,384 ranks at once would not fit
    parts = per_rank.chunks(run.ranks, per_rank.event_counts(run))
    done = per_rank.map_chunks(run, parts, _roofline_and_mfu, (ctx.get("device"), len(parts) == 1),
                               what="the low-MFU finding")
    rf, mfu = pd.concat([d[0] for d in done], ignore_index=True), pd.concat([d[1] for d in done], ignore_index=True)
    whole = done[0][2]
    rf = rf[rf.op_class.isin(["gemm", "attention"]) & rf.share_pct.notna()]
    _, per = ctx["per_rank"]
    best = None
    for row in rf.itertuples():
        v = per.get(int(row.rank))
        if not v or row.share_pct >= LOW_MFU_PCT:
            continue
        steps = max(v["steps"], 1)
        share_step = 100.0 * row.kernel_ns / steps / max(v["step_ns"], 1.0)
        if share_step >= MIN_SHARE_PCT and (best is None or row.kernel_ns > best[0].kernel_ns):
            best = (row, share_step)
    if best is None:
        return []
    row, share_step = best
    r = int(row.rank)
    if whole is None:
        whole = per_rank.map_chunks(run, [[r]], _op_table)[0]  # the best rank's table again, alone
    ops, kern = whole
    mine = ops[(ops["rank"] == r) & (ops.op_class == row.op_class) & ops.kernel_ns.notna()]
    names = sorted(set(kern.merge(mine[["rank", "event_id"]], on=["rank", "event_id"]).name))
    if not names:
        return []
    factor = round(ROOFLINE_TARGET_PCT / row.share_pct, 4)
    m = mfu[mfu["rank"] == r]
    mfu_txt = (f"; mfu: rank {r} at {m.mfu_pct.iloc[0]:.1f}% MFU ({m.dtype.iloc[0]} peak {m.peak_tflops.iloc[0]:g} "
               f"TFLOP/s on {m.device.iloc[0]})") if len(m) and m.mfu_pct.notna().iloc[0] else ""
    return [Candidate(
        kind="low_mfu", rank=r,
        title=f"rank {r}'s {row.op_class} kernels reach {row.share_pct:.0f}% of their {row.bound}-bound roofline",
        evidence=[_ev("roofline", f"rank {r} {row.op_class}: {row.achieved_tflops:.1f} TFLOP/s and "
                      f"{row.achieved_gbps:.0f} GB/s at {row.intensity_flop_per_byte:.1f} FLOP/byte, {row.bound}-bound, "
                      f"{row.share_pct:.1f}% of the attainable {row.attainable_tflops:.1f} TFLOP/s; their kernels "
                      f"take {share_step:.1f}% of the step" + mfu_txt)],
        fix=f"better {row.op_class} kernels for these shapes: larger or padded dimensions (multiples of 64/128), "
            "a fused attention kernel, cuBLASLt / hipBLASLt tuning, bf16 instead of fp32",
        scenario={"compute": {"speedup": [{"name": "^(" + "|".join(re.escape(n) for n in names) + ")$",
                                           "factor": factor}]}},
        confidence="low",
        assumptions=f"the {len(names)} kernel name(s) these ops launched reach {ROOFLINE_TARGET_PCT:.0f}% of their "
                    f"roofline bound (x{factor:.2f} faster); everything else unchanged",
        share_pct=share_step)]


def pipeline_imbalance(run, ctx) -> list[Candidate]:
    stage = ctx.get("stages")
    if not stage:
        return []
    _, per = ctx["per_rank"]
    # each rank's compute per step (compute_per_step: its compute kernels on a GPU rank, else its CPU operators
    # outside collective calls), median over the profiled steps
    df = run.analyze("compute_per_step")
    if df.empty:
        return []
    compute = {int(r): float(np.median(x.compute_ns)) for r, x in df.groupby("rank")}
    stages = sorted({stage[r] for r in compute if r in stage})
    if len(stages) < 2:
        return []
    of_stage = {s_: float(np.mean([c for r, c in compute.items() if stage.get(r) == s_])) for s_ in stages}
    mean = float(np.mean(list(of_stage.values())))
    slow = max(stages, key=lambda s_: of_stage[s_])
    step_ns = max(v["step_ns"] for v in per.values()) if per else 0.0
    share = 100.0 * (of_stage[slow] - mean) / step_ns if step_ns else 0.0
    if share < MIN_SHARE_PCT or mean <= 0:
        return []
    ranks_of = {s_: sorted(r for r in compute if stage.get(r) == s_) for s_ in stages}
    # the slow stage's compute brought to the stages' mean. Scaling the lighter stages up by what they would
    # receive as well was tried on recorded 2-stage runs: the replay then stretched every CPU op of the
    # receiving stage (its loss, optimizer and framework ops too, not only the moved layers) and predicted no
    # saving where the balanced run recorded 7% less, 18.5 -> 17.2 ms (docs/doctor.md)
    factor = round(mean / of_stage[slow], 4)
    who = ", ".join(str(r) for r in ranks_of[slow])
    figures = "; ".join(f"stage {s_} (rank{'s' if len(ranks_of[s_]) > 1 else ''} "
                        f"{', '.join(str(r) for r in ranks_of[s_])}) {_ms(of_stage[s_])}" for s_ in stages)
    n_steps = max((per.get(r, {}).get("steps", 1) for r in compute), default=1)
    return [Candidate(
        kind="pipeline_imbalance", rank=ranks_of[slow][0] if len(ranks_of[slow]) == 1 else None,
        title=f"pipeline stage {slow} computes {of_stage[slow] / mean:.2f}x the stages' mean per step; the other "
              "stages wait for it in bubbles",
        evidence=[_ev("compute_per_step", f"compute per step (median over {n_steps} step(s); compute kernels on a GPU rank, "
                      f"else CPU operators outside collective calls): {figures}; the stages' mean "
                      f"{_ms(mean)}, stage {slow} {_ms(of_stage[slow] - mean)} above it, "
                      f"{share:.1f}% of the {_ms(step_ns)} step")],
        fix=f"move layers from stage {slow} (rank{'s' if len(ranks_of[slow]) > 1 else ''} {who}) to the lighter "
            "stages, or give the first and last stages fewer layers to carry the embedding and the loss "
            "(Megatron: --decoder-first/last-pipeline-num-layers; torch.distributed.pipelining: split_spec)",
        scenario={"compute": {"rank_slowdown": {str(r): factor for r in ranks_of[slow]}}},
        confidence="medium",
        assumptions=f"stage {slow}'s compute scaled to the stages' mean (x{factor:.3f}), the other stages unchanged: "
                    "the compute the moved layers add to them is taken to fit in their bubbles (optimistic where "
                    "it does not); layers come in whole units, so a real split lands near, not on, the mean; the "
                    "activations sent between stages keep their measured transfer",
        share_pct=share)]


DETECTORS = (straggler, exposed_communication, host_bound, data_loading, sync_stalls, small_kernels,
             oom_risk, memory_headroom, low_mfu, pipeline_imbalance)
