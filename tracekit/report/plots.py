"""One function per plot: DataFrames in (from analyses, with their documented
columns), a plotly Figure out. Figures render inline in Jupyter and are
assembled into the HTML report by html.py.

Strings from traces (kernel names, ops, process groups) go through `_label`:
plotly draws text through its own pseudo-HTML parser (<b>, <br>, <a href=...>),
so a raw kernel name like `kernel<float, 4>` would be read as markup; escaped,
plotly decodes the entities and shows the name as written."""
from __future__ import annotations

import html

from . import require_plotly

NS_PER_MS = 1e6
MIB = 1024 * 1024
# Heatmap columns beyond this are the least useful part of a long trace and make the page heavy.
MAX_HEATMAP_COLLECTIVES = 400
# memory_timeline can hold millions of events; the plot keeps every n-th point per rank.
MAX_MEMORY_POINTS_PER_RANK = 5000


def _label(s) -> str:
    return html.escape(str(s), quote=False)


def no_data_figure(title: str, reason: str):
    """A panel that says why it is empty instead of an empty axis (or a crash)."""
    go = require_plotly()
    fig = go.Figure()
    fig.add_annotation(text=f"no data: {_label(reason)}", showarrow=False, x=0.5, y=0.5,
                       xref="paper", yref="paper", font={"size": 16, "color": "#666"})
    fig.update_layout(title=title, xaxis={"visible": False}, yaxis={"visible": False}, height=260)
    fig.layout.meta = {"tracekit_no_data": reason}
    return fig


def is_no_data(fig) -> bool:
    meta = fig.layout.meta
    return isinstance(meta, dict) and "tracekit_no_data" in meta


def _rank_names(ranks):
    return [f"rank {int(r)}" for r in ranks]


def step_time(steps):
    """Step duration per rank and step. steps: report.data.step_times() columns."""
    title = "Step time per rank"
    if steps is None or steps.empty:
        return no_data_figure(title, "no ProfilerStep#N annotations in the trace")
    go = require_plotly()
    fig = go.Figure()
    for rank, g in steps.groupby("rank", sort=True):
        fig.add_bar(name=f"rank {int(rank)}", x=[f"step {int(s)}" for s in g["step"]],
                    y=g["dur_ns"] / NS_PER_MS,
                    hovertemplate="%{x}: %{y:.3f} ms<extra>rank " + str(int(rank)) + "</extra>")
    fig.update_layout(title=title, barmode="group", xaxis_title="step (the last is often cut short)",
                      yaxis_title="step duration (ms)")
    return fig


def temporal_breakdown(df):
    """Idle / compute / non-compute time per rank, stacked. df: temporal_breakdown (per rank)."""
    title = "Temporal breakdown per rank"
    if df is None or df.empty:
        return no_data_figure(title, "no GPU or CPU ops in the trace")
    go = require_plotly()
    df = df[df["step"].isna()] if "step" in df and df["step"].isna().any() else df
    x = [f"rank {int(r)} ({t})" for r, t in zip(df["rank"], df["timeline"])]
    fig = go.Figure()
    for col, name in (("compute_ns", "compute"), ("non_compute_ns", "non-compute"), ("idle_ns", "idle")):
        fig.add_bar(name=name, x=x, y=df[col] / NS_PER_MS, hovertemplate="%{x}: %{y:.3f} ms<extra>" + name + "</extra>")
    fig.update_layout(title=title, barmode="stack", yaxis_title="time in the op span (ms)")
    return fig


def comm_comp_overlap(df):
    """Communication hidden under compute vs exposed, per rank and step (median step). df: exposed_comm per rank
    (report/data.exposed_per_rank: the figure whatif and doctor quote)."""
    title = "Communication per step: hidden under compute vs exposed, per rank"
    if df is None or df.empty or not (df["comm_ns"].fillna(0) > 0).any():  # gpu ranks without NCCL
        return no_data_figure(title, "no communication kernels or collectives in the trace")
    go = require_plotly()
    x = [f"rank {int(r)} ({t})" for r, t in zip(df["rank"], df["timeline"])]
    fig = go.Figure()
    fig.add_bar(name="overlapped with compute", x=x, y=df["overlap_ns"] / NS_PER_MS,
                hovertemplate="%{x}: %{y:.3f} ms<extra>overlapped</extra>")
    fig.add_bar(name="exposed", x=x, y=df["exposed_comm_ns"] / NS_PER_MS,
                hovertemplate="%{x}: %{y:.3f} ms<extra>exposed</extra>")
    fig.update_layout(title=title, barmode="stack", yaxis_title="communication per step (ms, median step)")
    return fig


def top_kernels(df, top_n: int = 15):
    """Kernels with the most GPU time, summed over ranks. df: kernel_breakdown (by name)."""
    title = "Top kernels by total GPU time (all ranks)"
    if df is None or df.empty:
        return no_data_figure(title, "no GPU kernels in the trace")
    go = require_plotly()
    agg = (df.groupby(["name", "kernel_class"], as_index=False)
             .agg(total_ns=("total_ns", "sum"), kernel_count=("kernel_count", "sum"))
             .sort_values("total_ns", ascending=False).head(top_n).iloc[::-1])
    labels = [_label(n if len(n) <= 90 else n[:87] + "...") for n in agg["name"]]
    fig = go.Figure()
    for cls in agg["kernel_class"].unique():
        m = (agg["kernel_class"] == cls).to_numpy()
        fig.add_bar(name=_label(cls), orientation="h", y=[l for l, k in zip(labels, m) if k],
                    x=agg.loc[m, "total_ns"] / NS_PER_MS, customdata=agg.loc[m, "kernel_count"],
                    hovertemplate="%{y}<br>%{x:.3f} ms over %{customdata} launches<extra></extra>")
    fig.update_layout(title=title, xaxis_title="total GPU time (ms)", height=max(320, 28 * len(agg) + 120),
                      yaxis={"categoryorder": "array", "categoryarray": labels, "automargin": True})
    return fig


def collective_skew(arrivals):
    """Heatmap rank x collective of arrival delay (how long after the first rank each rank arrived).
    arrivals: report.data.collective_arrivals() (rank, match_key, op, bytes, start_ns, arrival_delay_ns)."""
    title = "Collective arrival skew (rank x collective)"
    if arrivals is None or arrivals.empty:
        return no_data_figure(title, "no timed collectives in the trace")
    go = require_plotly()
    firsts = arrivals.groupby("match_key")["start_ns"].min().sort_values()
    keys = list(firsts.index[-MAX_HEATMAP_COLLECTIVES:])
    sub = arrivals[arrivals["match_key"].isin(keys)]
    grid = sub.pivot_table(index="rank", columns="match_key", values="arrival_delay_ns", aggfunc="max")
    grid = grid.reindex(columns=keys)
    ops = sub.groupby("match_key")["op"].first().reindex(keys)
    xs = [f"#{i} {_label(op)}" for i, op in enumerate(ops)]
    fig = go.Figure(go.Heatmap(z=grid.to_numpy() / NS_PER_MS, x=xs, y=_rank_names(grid.index),
                               colorscale="Reds", colorbar={"title": "ms late"},
                               hovertemplate="%{y}, %{x}: %{z:.3f} ms after the first rank<extra></extra>"))
    fig.update_layout(title=title + ("" if len(firsts) <= len(keys) else f" (last {len(keys)} of {len(firsts)})"),
                      xaxis_title="collective, in order of first arrival", yaxis_title="rank",
                      yaxis={"autorange": "reversed"}, height=max(300, 30 * len(grid.index) + 160))
    return fig


def busbw_vs_size(matched):
    """Bus bandwidth against message size, one point per matched collective. matched: collectives_matched."""
    title = "Bus bandwidth vs message size"
    df = None if matched is None or matched.empty else matched[matched["busbw_gbps"].notna() & (matched["bytes"] > 0)]
    if df is None or df.empty:
        return no_data_figure(title, "no matched collectives with a size and a transfer time")
    go = require_plotly()
    fig = go.Figure()
    for op, g in df.groupby("op", sort=True):
        fig.add_scatter(name=_label(op), mode="markers", x=g["bytes"], y=g["busbw_gbps"],
                        customdata=g["group_size"],
                        hovertemplate="%{x:,} bytes: %{y:.3g} GB/s (group of %{customdata})<extra>"
                                      + _label(op) + "</extra>")
    fig.update_layout(title=title, xaxis={"type": "log", "title": "message size (bytes)"},
                      yaxis_title="busbw (GB/s)")
    return fig


def straggler_ranking(df):
    """Ranks ordered by the waiting they caused others by arriving last. df: straggler_attribution."""
    title = "Straggler ranking: wait caused by arriving last"
    if df is None or df.empty:
        return no_data_figure(title, "no collectives matched across two or more ranks")
    go = require_plotly()
    df = df[df["step"].isna()] if df["step"].isna().any() else df
    df = df.sort_values("caused_wait_ns", ascending=True)
    fig = go.Figure()
    fig.add_bar(orientation="h", y=_rank_names(df["rank"]), x=df["caused_wait_ns"].fillna(0) / NS_PER_MS,
                customdata=df[["late_count", "collectives"]].to_numpy(),
                marker_color=["#d62728" if late else "#1f77b4" for late in df["consistently_late"].fillna(False)],
                hovertemplate="%{y}: caused %{x:.3f} ms of waiting; last at %{customdata[0]} "
                              "of %{customdata[1]} collectives<extra></extra>")
    fig.update_layout(title=title + " (red: consistently late)", xaxis_title="others' wait caused (ms)",
                      height=max(300, 30 * len(df) + 140))
    return fig


def memory_timeline(df):
    """Allocated bytes over time per rank and device. df: memory_timeline."""
    title = "Memory timeline (allocated)"
    if df is None or df.empty:
        return no_data_figure(title, "no [memory] events (profile with profile_memory=True)")
    go = require_plotly()
    t0 = df["ts_ns"].min()
    fig = go.Figure()
    for (rank, dev), g in df.groupby(["rank", "device_id"], sort=True):
        step = max(1, len(g) // MAX_MEMORY_POINTS_PER_RANK)
        g = g.iloc[::step]
        dev_name = "cpu" if int(dev) < 0 else f"cuda:{int(dev)}"
        fig.add_scatter(name=f"rank {int(rank)} {dev_name}", mode="lines", line_shape="hv",
                        x=(g["ts_ns"] - t0) / NS_PER_MS, y=g["allocated_bytes"] / MIB)
    fig.update_layout(title=title, xaxis_title="time since the first memory event (ms)",
                      yaxis_title="allocated (MiB)")
    return fig


def memory_categories(df):
    """Bytes of each memory category over time, stacked in the analysis's category order, one panel row per rank
    and device (those with the largest category first, up to four). df: memory_category_timeline."""
    title = "Memory by category over time"
    if df is None or df.empty:
        return no_data_figure(title, "no [memory] events (profile with profile_memory=True)")
    go = require_plotly()
    from plotly.subplots import make_subplots

    t0 = df["ts_ns"].min()
    largest = df.groupby(["rank", "device_type", "device_id"])["bytes"].max().sort_values(ascending=False)
    keys = list(largest.index[:4])
    categories = list(dict.fromkeys(df["category"]))  # the analysis lists every category at a device's first event
    names = [f"rank {int(r)} {'cpu' if int(d) < 0 else f'cuda:{int(d)}'}" for r, _, d in keys]
    fig = make_subplots(rows=len(keys), cols=1, shared_xaxes=True, subplot_titles=names, vertical_spacing=0.08)
    for row, key in enumerate(keys, start=1):
        g = df[(df["rank"] == key[0]) & (df["device_type"] == key[1]) & (df["device_id"] == key[2])]
        # one row per category change: hold each category's bytes until its next row
        wide = g.pivot_table(index="ts_ns", columns="category", values="bytes", aggfunc="last").sort_index().ffill()
        step = max(1, len(wide) // MAX_MEMORY_POINTS_PER_RANK)
        wide = wide.iloc[::step].fillna(0)
        x = (wide.index - t0) / NS_PER_MS
        for i, cat in enumerate(categories):
            fig.add_scatter(row=row, col=1, name=cat, legendgroup=cat, showlegend=row == 1, mode="lines",
                            line={"width": 0.5, "shape": "hv", "color": _MEMORY_COLORS[i % len(_MEMORY_COLORS)]},
                            stackgroup=f"s{row}", x=x, y=wide[cat] / MIB,
                            hovertemplate="%{x:.3f} ms: %{y:.2f} MiB<extra>" + cat + "</extra>")
        fig.update_yaxes(title_text="allocated (MiB)", row=row, col=1)
    fig.update_xaxes(title_text="time since the first memory event (ms)", row=len(keys), col=1)
    fig.update_layout(title=title + ("" if len(largest) <= len(keys) else f" (the {len(keys)} of {len(largest)} "
                                     "devices with the most bytes)"), height=260 * len(keys) + 140)
    return fig


_MEMORY_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#d62728", "#7f7f7f")


def roofline(df):
    """Achieved TFLOP/s against arithmetic intensity per rank and op kind, under each device's roof
    (min(peak, intensity x memory bandwidth)). df: report.data.roofline_points()."""
    title = "Roofline: achieved TFLOP/s by arithmetic intensity"
    if df is None or df.empty:
        return no_data_figure(title, "no operator with recorded shapes launched GPU kernels (a roofline needs both)")
    df = df[df["intensity_flop_per_byte"].fillna(0) > 0]
    if df.empty:
        return no_data_figure(title, "the GPU ops with recorded shapes do no FLOPs (elementwise only)")
    import numpy as np

    go = require_plotly()
    fig = go.Figure()
    lo = float(df["intensity_flop_per_byte"].min()) / 10
    hi = float(df["intensity_flop_per_byte"].max()) * 10
    roofs = df.dropna(subset=["peak_tflops", "memory_gbps"]).drop_duplicates(["device", "dtype"])
    for r in roofs.itertuples():
        ridge = r.peak_tflops * 1e3 / r.memory_gbps
        xs = [lo, *([ridge] if lo < ridge < hi else []), hi]
        fig.add_scatter(name=_label(f"{r.device} {r.dtype} roof"), mode="lines", line={"dash": "dot"},
                        x=xs, y=[min(r.peak_tflops, x * r.memory_gbps / 1e3) for x in xs],
                        hovertemplate="%{x:.3g} FLOP/B: roof %{y:.4g} TFLOP/s<extra></extra>")
    for cls, g in df.groupby("op_class", sort=True):
        share = g["share_pct"].to_numpy(dtype="float64", na_value=np.nan)
        fig.add_scatter(name=_label(cls), mode="markers", x=g["intensity_flop_per_byte"], y=g["achieved_tflops"],
                        customdata=np.stack([g["rank"].to_numpy(), share], axis=1),
                        marker={"size": 10}, hovertemplate="rank %{customdata[0]}: %{x:.3g} FLOP/B, %{y:.4g} "
                        "TFLOP/s, %{customdata[1]:.1f}% of its bound<extra>" + _label(cls) + "</extra>")
    fig.update_layout(title=title + " (FLOP-less ops not drawn)",
                      xaxis={"type": "log", "title": "arithmetic intensity (FLOP per byte)"},
                      yaxis={"type": "log", "title": "achieved TFLOP/s (kernel time)"})
    return fig


# panel name -> plot function, in report order (data.PANEL_DATA has the same keys).
PLOTS = {
    "step_time": step_time,
    "temporal_breakdown": temporal_breakdown,
    "comm_comp_overlap": comm_comp_overlap,
    "top_kernels": top_kernels,
    "collective_skew": collective_skew,
    "busbw_vs_size": busbw_vs_size,
    "straggler_ranking": straggler_ranking,
    "memory_timeline": memory_timeline,
    "memory_categories": memory_categories,
    "roofline": roofline,
}


def predicted_vs_measured(df):
    """Job step time measured vs predicted per scenario, with the change. df: replay.whatif.COLUMNS."""
    title = "Predicted vs measured step time"
    if df is None or df.empty:
        return no_data_figure(title, "no scenario given (tracekit report --scenario FILE)")
    go = require_plotly()
    fig = go.Figure()
    names = [_label(s) for s in df["scenario"]]
    fig.add_bar(name="measured", x=names, y=df["measured_step_ns"] / NS_PER_MS,
                hovertemplate="%{x}: measured %{y:.3f} ms<extra></extra>")
    fig.add_bar(name="predicted", x=names, y=df["predicted_step_ns"] / NS_PER_MS,
                text=[f"{c:+.1f}%" for c in df["change_pct"]], textposition="outside",
                hovertemplate="%{x}: predicted %{y:.3f} ms (%{text})<extra></extra>")
    fig.update_layout(title=title, barmode="group", xaxis_title="scenario (replayed with tracekit replay)",
                      yaxis_title="step time, slowest rank's median (ms)")
    return fig
