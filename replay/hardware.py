"""[hardware]: the run re-timed for another GPU by each op's roofline position.

Each GPU op the trace attributes to an operator with a FLOP count (analyses/flops.py: FLOPs F and bytes
B from the recorded shapes, its dtype d) keeps the share of its roofline bound that it reached:

    t_new = t_measured * max(F / P_new[d], B / BW_new) / max(F / P_old[d], B / BW_old)

so a compute-bound GEMM follows the peak ratio of its dtype, a memory-bound one the bandwidth ratio, and
one near the ridge whichever bound it falls under on each device (fp32 GEMMs whose kernels are TF32 by
name use the tf32 peak). Every other GPU op follows the memory bandwidth ratio BW_old / BW_new: the
FLOP-less ones (elementwise, norms, copies on the device, memsets) and the ones without a FLOP count (an
operator outside the FLOP table, or no recorded shapes; the note says how much kernel time that is).
Host <-> device copies (Memcpy HtoD / DtoH / PtoP) are paced by the host link, which the catalog does not
describe: unchanged. Communication kernels are the network model's ([network]; unchanged by default),
CPU work is unchanged unless [compute] cpu_scale says otherwise, and the sync calls' waiting follows
the GPU in the replay. A step that waits on its host (launch-bound) or on its links does not speed up:
the replay's note says so when the step changes much less than its kernels (bound_notes).

The run's device is each rank's deviceProperties entry matched in the catalog (analyses/devices.py),
or [hardware] from_gpu; the new one is [hardware] gpu from the catalog, its figures overridden by the
ones the section gives (bf16_tflops, memory_gbps, ...).
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pandas as pd

from analyses import depgraph as _graph
from analyses import devices as _devices
from analyses import flops as _flops
from tracekit.errors import TracekitError

from .checks import ScenarioError

HOST_COPIES = ("Memcpy HtoD", "Memcpy DtoH", "Memcpy PtoP", "Memcpy HtoH")
CHANGE = 0.5  # a step that changes by less than this share of its kernels' change (in log) gets the note


def catalog(spec, where: str) -> list:
    """The device catalog the section uses ([hardware] catalog, else $TRACEKIT_DEVICE_CATALOG, and the bundled)."""
    try:
        return _devices.catalog(spec.catalog)
    except TracekitError as e:
        raise ScenarioError(f"{where}: [hardware] catalog: {e}") from None


def named(spec, key: str, devices: list, where: str):
    """The device [hardware] <key> names, or None when the key is not given; an unknown name is the error."""
    name = getattr(spec, key)
    if name is None:
        return None
    d = _devices.resolve(name, devices)
    if d is None:
        raise ScenarioError(f"{where}: [hardware] {key}: {name!r} is not in the device catalog; allowed: "
                            f"{', '.join(x.name for x in devices)} (or add it with [hardware] catalog"
                            + (", or give its figures: fp16_tflops, bf16_tflops, ..., memory_gbps)" if key == "gpu"
                               else ")"))
    return d


def target(spec, devices: list, where: str):
    """The new device: [hardware] gpu's, its figures overridden by the section's own."""
    base = named(spec, "gpu", devices, where)
    own = spec.own_figures
    if base is None:
        return _devices.Device("the [hardware] figures", "", {k: v for k, v in own.items() if k != "memory_gbps"},
                               own.get("memory_gbps"), where)
    if not own:
        return base
    peaks = {**base.peaks_tflops, **{k: v for k, v in own.items() if k != "memory_gbps"}}
    return dataclasses.replace(base, name=f"{base.name} (figures from [hardware])", peaks_tflops=peaks,
                               memory_gbps=own.get("memory_gbps", base.memory_gbps))


def check(spec, where: str) -> None:
    """What the loader checks before any work: the catalog, the names, the figures."""
    devs = catalog(spec, where)
    named(spec, "from_gpu", devs, where)
    target(spec, devs, where)


@dataclasses.dataclass
class RetimedOps:
    """The GPU ops [hardware] re-timed: their nodes, and their durations before and after (ns)."""
    nodes: np.ndarray
    old_ns: np.ndarray
    new_ns: np.ndarray


@dataclasses.dataclass
class Retimed:
    factor: np.ndarray  # per node: the multiplier of its duration (1.0 where unchanged)
    notes: list
    ops: RetimedOps | None  # None: no GPU op to re-time


def retime(g, run, spec, dur_ns: np.ndarray, where: str) -> Retimed:
    """Per node, the multiplier [hardware] puts on its duration, with the notes that say how."""
    devs = catalog(spec, where)
    new = target(spec, devs, where)
    from_gpu = named(spec, "from_gpu", devs, where)
    nodes = g.nodes()
    gpu = np.flatnonzero((g.kind == _graph.K["gpu"]) & (nodes.kernel_class.to_numpy(object) != "communication"))
    factor = np.ones(g.n_nodes)
    if not len(gpu):
        return Retimed(factor, [f"{where}: [hardware] changes nothing: the run has no GPU ops"], None)
    ranks = sorted({int(r) for r in g.rank[gpu]})
    old = _sources(run, ranks, from_gpu, devs, where)
    ops, kern = _flops.op_table_with_kernels(run)  # _op_factors keeps the kernels of the ops kept here
    ops = ops[ops["rank"].isin(ranks) & ops.flops.notna()]
    per_op = _op_factors(ops, kern, old, new, where)
    # each GPU node: its op's factor, else the bandwidth ratio (host copies: unchanged)
    frame = pd.DataFrame({"rank": g.rank[gpu].astype(np.int64), "kernel_event_id": g.event_id[gpu].astype(np.int64)})
    hit = frame.merge(per_op, on=["rank", "kernel_event_id"], how="left")
    f = hit.factor.to_numpy("float64", na_value=np.nan)
    names = nodes.name.to_numpy(object)[gpu]
    host_copy = np.array([isinstance(n, str) and n.startswith(HOST_COPIES) for n in names], bool)
    bw = np.array([_bandwidth_ratio(old[int(r)], new, where) for r in g.rank[gpu]])
    how = np.where(~np.isnan(f), hit.bound.to_numpy(object), np.where(host_copy, "host copy", "bandwidth"))
    f = np.where(np.isnan(f), np.where(host_copy, 1.0, bw), f)
    factor[gpu] = f
    d = dur_ns[gpu].astype(np.float64)
    notes = [_summary(where, old, new, ranks, how, d, f)]
    return Retimed(factor, notes, RetimedOps(gpu, d, d * f))


def _sources(run, ranks, from_gpu, devs, where) -> dict:
    if from_gpu is not None:
        return {r: from_gpu for r in ranks}
    found = _flops.rank_devices(run, devs)
    out = {}
    for r in ranks:
        dev, name = found.get(r, (None, None))
        if dev is None:
            said = f"its device {name!r} is not in the device catalog" if name else "its trace names no device"
            raise ScenarioError(f"{where}: [hardware] from_gpu: rank {r}: {said}; name the run's GPU with "
                                f"[hardware] from_gpu (one of: {', '.join(x.name for x in devs)}) or add it "
                                "with [hardware] catalog")
        out[r] = dev
    return out


def _op_factors(ops: pd.DataFrame, kern: pd.DataFrame, old: dict, new, where: str) -> pd.DataFrame:
    """Per launched kernel of an op with a FLOP count: the op's roofline time ratio and the bound it is under
    on the run's device. Columns rank, kernel_event_id, factor, bound."""
    if not len(ops) or not len(kern):
        return pd.DataFrame({"rank": pd.Series([], dtype="int64"), "kernel_event_id": pd.Series([], dtype="int64"),
                             "factor": pd.Series([], dtype="float64"), "bound": pd.Series([], dtype=object)})
    tf32 = set(kern[kern.name.str.contains("tf32", case=False, na=False)].event_id.astype(np.int64))
    rows = []
    for r, e, fl, by, dt in zip(ops["rank"], ops.event_id, ops.flops, ops.bytes, ops.dtype):
        r, fl = int(r), float(fl)
        by = 0.0 if pd.isna(by) else float(by)
        src = old[r]
        if fl <= 0 and by <= 0:
            continue
        dt = "tf32" if dt == "fp32" and int(e) in tf32 else (dt or "fp32")
        t_old, bound = _roofline_time(fl, by, src, dt, where, "from_gpu")
        t_new, _ = _roofline_time(fl, by, new, dt, where, "gpu")
        rows.append((r, int(e), t_new / t_old, bound))
    per = pd.DataFrame(rows, columns=["rank", "event_id", "factor", "bound"])
    out = kern[["rank", "event_id", "kernel_event_id"]].merge(per, on=["rank", "event_id"], how="inner")
    return out.drop(columns="event_id").drop_duplicates(["rank", "kernel_event_id"])


def _roofline_time(fl: float, by: float, dev, dtype: str, where: str, key: str):
    """max(F / peak, B / bandwidth) on dev (seconds x 1e-12 units cancel in the ratio) and the bound."""
    compute = 0.0
    if fl > 0:
        peak = dev.peak(dtype)
        if peak is None:
            fix = f"give [hardware] {dtype}_tflops" if key == "gpu" else "add it with [hardware] catalog"
            raise ScenarioError(f"{where}: [hardware] {key}: {dev.name} has no {dtype} peak in the device catalog "
                                f"and the run has {dtype} FLOPs; {fix}")
        compute = fl / peak
    memory = by / _bandwidth(dev, where, key) if by > 0 else 0.0
    return max(compute, memory), ("compute-bound" if compute >= memory else "memory-bound")


def _bandwidth(dev, where: str, key: str) -> float:
    if not dev.memory_gbps:
        fix = "give [hardware] memory_gbps" if key == "gpu" else "add it with [hardware] catalog"
        raise ScenarioError(f"{where}: [hardware] {key}: {dev.name} has no memory bandwidth in the device catalog; "
                            f"{fix}")
    return float(dev.memory_gbps)


def _bandwidth_ratio(old, new, where: str) -> float:
    return _bandwidth(old, where, "from_gpu") / _bandwidth(new, where, "gpu")


def _summary(where, old, new, ranks, how, d, f) -> str:
    total = d.sum() or 1.0
    olds = sorted({old[r].name for r in ranks})
    parts = []
    for label in ("compute-bound", "memory-bound", "bandwidth", "host copy"):
        sel = how == label
        if not sel.any():
            continue
        x = (d[sel] * f[sel]).sum() / max(d[sel].sum(), 1.0)
        what = {"compute-bound": "ops compute-bound on their roofline",
                "memory-bound": "ops memory-bound on their roofline",
                "bandwidth": "ops without a FLOP count (FLOP-less, or outside the FLOP table), by the memory "
                             "bandwidth ratio",
                "host copy": "host <-> device copies, unchanged (the host link is not in the catalog)"}[label]
        parts.append(f"{100 * d[sel].sum() / total:.0f}% of the kernel time: {what}, time x{x:.3g}")
    return (f"{where}: [hardware] {', '.join(olds)} -> {new.name}: GPU ops re-timed by their roofline position: "
            + "; ".join(parts) + ". Communication follows [network] (unchanged unless it says), CPU work "
            "[compute] cpu_scale")


def bound_notes(res) -> list[str]:
    """The note a launch-bound (or link-bound) step gets: the step changes much less than its kernels."""
    ops = res.info.hardware
    s = res.summary()
    if ops is None or s.empty:
        return []
    worst = s.loc[s.predicted_step_ns.idxmax()]
    r = int(worst["rank"])
    g = res.graph
    nodes = ops.nodes
    mine = g.rank[nodes] == r
    k = ops.old_ns[mine].sum() / max(ops.new_ns[mine].sum(), 1.0)
    step = worst.measured_step_ns / max(worst.predicted_step_ns, 1)
    if k <= 0 or abs(np.log(k)) < 0.05 or abs(np.log(max(step, 1e-9))) >= CHANGE * abs(np.log(k)):
        return []
    st = g.steps[g.steps["rank"] == r]
    span = float((st.end_ns - st.ts_ns).sum()) if len(st) else float(worst.measured_step_ns)
    start = g.start_ns[nodes][mine]
    inside = np.zeros(len(start), bool)
    for a, b in zip(st.ts_ns, st.end_ns):
        inside |= (start >= a) & (start < b)
    busy = ops.old_ns[mine][inside].sum() if len(st) else ops.old_ns[mine].sum()
    return [f"[hardware]: the step takes x{1 / step:.3g} of its time where its GPU ops take x{1 / k:.3g} (rank {r}, the "
            "slowest): "
            f"its GPU computes {100 * busy / max(span, 1.0):.0f}% of the measured step; the rest is host launches, "
            "CPU work or communication, which another GPU does not shorten (a launch-bound step does not speed "
            "up: try [compute] cpu_scale, or fewer, larger kernels)"]


def catalog_path(value: str, source: str | None) -> str:
    """[hardware] catalog as written, relative to the scenario file's folder."""
    if os.path.isabs(value) or not source or source.startswith("<"):
        return value
    return os.path.join(os.path.dirname(os.path.abspath(source)), value)
