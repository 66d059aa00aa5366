"""The DataFrame behind each report panel. Every panel but step time is a
registered analysis; step time reads the `steps` view directly because it is a
plain column of the store, not a computation."""
from __future__ import annotations

# Columns of step_times(), with units, documented like an analysis's @column lines.
STEP_TIME_COLUMNS = {
    "rank": "global rank",
    "step": "N of ProfilerStep#N",
    "dur_ns": "CPU duration of the step annotation, ns",
    "gpu_span_ns": "last GPU op end - first GPU op start of ops launched in the step, ns (NULL: no GPU ops)",
    "is_last": "last step of the trace (often cut short by the profiler)",
}


def step_times(run):
    """One row per (rank, step): STEP_TIME_COLUMNS."""
    return run.sql("SELECT rank, step, dur_ns, gpu_end_ns - gpu_start_ns AS gpu_span_ns, is_last "
                   "FROM steps ORDER BY rank, step")


def collective_arrivals(run):
    """One row per (rank, timed collective) from the `collectives` analysis: the heatmap's cells."""
    df = run.analyze("collectives")
    cols = ["rank", "match_key", "op", "bytes", "start_ns", "arrival_delay_ns"]
    return df.loc[df["start_ns"].notna(), cols].reset_index(drop=True)


ROOFLINE_POINT_COLUMNS = "the roofline analysis's columns, and peak_tflops / memory_gbps: the device's roof"


def roofline_points(run, device: str | None = None):
    """The roofline analysis per (rank, op kind) with the roof of its device: peak_tflops for its dtype
    and memory_gbps from the device catalog (NULL where the device is unknown). device: as the analysis's."""
    from analyses.devices import catalog

    df = run.analyze("roofline", device=device)
    devs = {d.name: d for d in catalog()}
    dev = [devs.get(n) if isinstance(n, str) else None for n in df.get("device", [])]
    df = df.assign(peak_tflops=[d.peak(t) if d else None for d, t in zip(dev, df.get("dtype", []))],
                   memory_gbps=[d.memory_gbps if d else None for d in dev])
    return df


def exposed_per_rank(run):
    """Per rank, exposed and overlapped communication per step: the exposed_comm analysis's per-rank medians,
    the figure `tracekit whatif` and doctor quote (analyses/exposed_comm.py)."""
    from analyses.exposed_comm import exposed_comm_per_rank

    return exposed_comm_per_rank(run.analyze("exposed_comm"))


# panel name -> (function of run returning the DataFrame, what it is). Order = report order.
PANEL_DATA = {
    "step_time": (step_times, "steps view"),
    "temporal_breakdown": (lambda run: run.analyze("temporal_breakdown"), "analysis temporal_breakdown"),
    "comm_comp_overlap": (exposed_per_rank, "analysis exposed_comm, per rank (median step)"),
    "top_kernels": (lambda run: run.analyze("kernel_breakdown", top_k=15), "analysis kernel_breakdown"),
    "collective_skew": (collective_arrivals, "analysis collectives"),
    "busbw_vs_size": (lambda run: run.analyze("collectives_matched"), "analysis collectives_matched"),
    "straggler_ranking": (lambda run: run.analyze("straggler_attribution"), "analysis straggler_attribution"),
    "memory_timeline": (lambda run: run.analyze("memory_timeline"), "analysis memory_timeline"),
    "memory_categories": (lambda run: run.analyze("memory_category_timeline"), "analysis memory_category_timeline "
                                                                                "(memory_breakdown's attribution)"),
    "roofline": (roofline_points, "analysis roofline and the device catalog"),
}
