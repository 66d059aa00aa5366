"""Replay a store: build its graph, apply the models, run the engine, map the result back onto every
event, and report step times measured vs predicted.

The re-timed events come from a monotone time warp per track (CPU thread or GPU stream): each node
pins its measured start and end to its replayed ones, and any other timestamp on the track (nested
ops, annotations, instants, flow ends) moves with the linear interpolation between the pins around
it. A ProfilerStep annotation therefore stretches with the work it encloses.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analyses import depgraph as _graph
from analyses.steps import median_steps

from .engine import Engine
from .model_steps import ModelInfo, apply_models
from .specs import Scenario

STEP_COLUMNS = {
    "rank": "global rank",
    "step": "ProfilerStep#N",
    "is_last": "last step of the trace (often cut short by the profiler; left out of the medians when the "
               "rank has other steps)",
    "measured_step_ns": "measured duration of the ProfilerStep annotation, ns",
    "predicted_step_ns": "replayed duration of the same annotation, ns",
    "measured_end_ns": "measured end of the step, ns after the replay origin",
    "predicted_end_ns": "replayed end of the step, ns after the replay origin",
}
SUMMARY_COLUMNS = {
    "rank": "global rank",
    "steps": "steps in the medians",
    "measured_step_ns": "median measured step time, ns",
    "predicted_step_ns": "median predicted step time, ns",
    "error_pct": "100 * (predicted - measured) / measured",
}


@dataclass
class ReplayResult:
    graph: "_graph.Graph"
    start_ns: np.ndarray  # replayed start per node
    end_ns: np.ndarray  # replayed end per node
    steps: pd.DataFrame  # STEP_COLUMNS
    run: object  # the tracekit Run replayed
    scenario: Scenario | None = None
    build_s: float = 0.0
    replay_s: float = 0.0
    notes: list = field(default_factory=list)
    info: ModelInfo = field(default_factory=ModelInfo)  # what the models chose
    folding: object = None  # replay.fold.Folding when ranks were folded

    # ---- figures
    def summary(self) -> pd.DataFrame:
        """Per rank: median measured and predicted step time over the steps (the last step is left out
        when the rank has others), and the error."""
        st = self.steps
        if not len(st):
            return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
        use = st[median_steps(st)]
        g = use.groupby("rank", sort=True)
        m = g.measured_step_ns.median().astype(float)
        p = g.predicted_step_ns.median().astype(float)
        err = (100.0 * (p - m) / m.where(m != 0)).astype(float)
        return pd.DataFrame({"rank": m.index.astype(int), "steps": g.size().to_numpy(),
                             "measured_step_ns": np.round(m.to_numpy()).astype(np.int64),
                             "predicted_step_ns": np.round(p.to_numpy()).astype(np.int64),
                             "error_pct": err.to_numpy()}, columns=list(SUMMARY_COLUMNS))

    def to_dict(self) -> dict:
        """The stable output: per-rank figures, the overall error (the worst rank's), and the counts."""
        s = self.summary()
        worst = float(s.error_pct.abs().max()) if len(s) else float("nan")
        return {
            "ranks": [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()} for row in s.to_dict("records")],
            "measured_step_ns": int(s.measured_step_ns.max()) if len(s) else None,
            "predicted_step_ns": int(s.predicted_step_ns.max()) if len(s) else None,
            "error_pct": worst,
            "mean_abs_error_pct": float(s.error_pct.abs().mean()) if len(s) else float("nan"),
            "scenario": self.scenario.name if self.scenario is not None else None,
            "nodes": self.graph.n_nodes,
            "edges": self.graph.n_edges,
            "collectives": len(self.graph.colls),
            "build_s": round(self.build_s, 4),
            "replay_s": round(self.replay_s, 4),
            "notes": list(self.notes),
        }

    # ---- the re-timed run
    def event_times(self, ranks=None) -> pd.DataFrame:
        """New (ts_ns, dur_ns) of every event of the replayed ranks: rank, event_id, ts_ns, dur_ns."""
        ranks = self.graph.ranks if ranks is None else ranks
        ev = self.run.sql("""SELECT rank, event_id, pid, tid, ts_ns, dur_ns FROM _events
                             WHERE rank IN (SELECT unnest($r::BIGINT[])) ORDER BY rank, event_id""",
                          {"r": list(ranks)})
        ts = ev.ts_ns.to_numpy("float64", na_value=np.nan)
        has_ts = ~np.isnan(ts)
        t = ev.ts_ns.fillna(0).to_numpy(np.int64)
        d = ev.dur_ns.fillna(0).to_numpy(np.int64)
        new_ts, new_end = self._warp(ev, t, t + d)
        out_ts = pd.array(np.where(has_ts, new_ts, 0), dtype="Int64")
        out_ts[~has_ts] = pd.NA
        out_dur = pd.array(new_end - new_ts, dtype="Int64")
        out_dur[ev.dur_ns.isna().to_numpy()] = pd.NA
        return pd.DataFrame({"rank": ev["rank"].to_numpy(np.int64), "event_id": ev.event_id.to_numpy(np.int64),
                             "ts_ns": out_ts, "dur_ns": out_dur})

    def write_store(self, out_dir: str, *, representatives: bool = False) -> str:
        """Write the re-timed run as a store in the measured runs' schema. A folded replay has times for its
        representatives only: representatives=True writes theirs (their label's ranks), else it is refused."""
        from tracekit.errors import TracekitError

        from .writer import write_retimed_store

        if self.folding is not None and not representatives:
            raise TracekitError(f"{out_dir}: {self.folding.folded_ranks} ranks were folded into others, so their "
                                "events have no times of their own: replay with fold=False (--no-fold) to write "
                                "the re-timed run")

        label = {"kind": "replay", "source_store": self.run.store.path,
                 "scenario": (self.scenario.name if self.scenario is not None else None) or "baseline",
                 "ranks": list(self.graph.ranks)}
        return write_retimed_store(self.run.store.path, out_dir, self.event_times(), label=label,
                                   ranks=list(self.graph.ranks) if self.folding is not None else None)

    def _warp(self, ev: pd.DataFrame, *points):
        """Map timestamps of events (rank, pid, tid) through their track's warp (the rank's main CPU
        thread for events on tracks without nodes)."""
        g = self.graph
        tr = g.tracks
        key = tr.set_index(["rank", "pid", "tid"])["track"]
        track = key.reindex(pd.MultiIndex.from_frame(ev[["rank", "pid", "tid"]].astype("Int64"))).to_numpy(
            "float64", na_value=np.nan)
        main = tr[tr.main].set_index("rank")["track"]
        fallback = main.reindex(ev["rank"]).to_numpy("float64", na_value=np.nan)
        if len(main) < len(set(ev["rank"])):  # ranks without CPU threads: their first track
            first = tr.groupby("rank")["track"].min()
            fallback = np.where(np.isnan(fallback), first.reindex(ev["rank"]).to_numpy("float64", na_value=np.nan),
                                fallback)
        track = np.where(np.isnan(track), fallback, track)
        outs = [np.array(p, dtype=np.int64, copy=True) for p in points]
        node_track = g.track
        for t in np.unique(track[~np.isnan(track)]).astype(np.int64):
            sel = track == t
            xs, delta = self._pins(np.flatnonzero(node_track == t))
            for o, p in zip(outs, points):  # relative to the origin: float64 is exact to the ns there
                rel = (p[sel] - g.origin_ns).astype(np.float64)
                o[sel] = p[sel] + np.rint(np.interp(rel, xs, delta)).astype(np.int64)
        return outs

    def _pins(self, ids):
        """Measured -> replayed pins of one track: its nodes' starts and ends, framed by the replay's
        origin and the run's last end so that timestamps before a track's first node or after its last
        one move with the run as a whole."""
        g = self.graph
        if not hasattr(self, "_frame"):
            meas_end = int((g.start_ns + g.dur_ns).max())
            self._frame = (0.0, float(meas_end - g.origin_ns), float(self.end_ns.max() - g.origin_ns))
        t0, m_end, r_end = self._frame
        # frame: the origin, the run's last end, and past it the tail stretched like the run as a whole
        xs = np.empty(2 * len(ids) + 3, np.float64)
        ys = np.empty(2 * len(ids) + 3, np.float64)
        s0 = g.start_ns[ids] - g.origin_ns
        xs[1:-2:2], xs[2:-2:2] = s0, s0 + g.dur_ns[ids]
        ys[1:-2:2], ys[2:-2:2] = self.start_ns[ids] - g.origin_ns, self.end_ns[ids] - g.origin_ns
        xs[0], ys[0] = t0, t0
        xs[-2], ys[-2] = max(m_end, xs[-3]), max(r_end, ys[-3])
        if xs[-2] == xs[-3]:  # the track's last node ends the run: its own pin stays, the frame comes 1 ns after
            xs[-2], ys[-2] = xs[-2] + 1, ys[-2] + 1
        xs[-1], ys[-1] = xs[-2] + (xs[-2] - t0), ys[-2] + (ys[-2] - t0)
        xs = np.maximum.accumulate(xs)
        ys = np.maximum.accumulate(ys)
        return xs, ys - xs


def _open(store_or_run):
    from tracekit.run import Run

    if isinstance(store_or_run, Run):
        return store_or_run
    import tracekit

    return tracekit.open(str(store_or_run))


FOLD_AUTO_RANKS = 64  # fold="auto" folds runs with more ranks than this


def folds(run, fold, wide=None) -> bool:
    """Whether a replay of every rank of run folds: fold True, or "auto" with more than FOLD_AUTO_RANKS ranks
    (wide: depgraph.run_wide(run), when read)."""
    if fold is True or fold is False:
        return fold
    if fold != "auto":  # a Folding: its classes, cut from the graph of every rank
        return False
    n = len(wide.ranks) if wide is not None else int(run.sql("SELECT count(*) AS n FROM ranks").n.iloc[0])
    return n > FOLD_AUTO_RANKS


def _fold_graph(full, fold, tolerance: float, keep: set):
    """The graph given (or built) of every rank, folded when fold says so (a Folding: into its classes): (graph,
    folding or None)."""
    from . import fold as _fold

    if isinstance(fold, _fold.Folding):
        return _fold.fold(full, fold), fold
    if fold is True or (fold == "auto" and len(full.ranks) > FOLD_AUTO_RANKS):
        folding = _fold.plan(full, tolerance, keep=keep)
        if folding.folded_ranks:
            return _fold.fold(full, folding), folding
    return full, None


def _fold_first(run, wide, tolerance: float, keep: set):
    """Fold before building: classes from the store, the representatives' graph alone (replay/fold.py)."""
    from . import fold as _fold

    wide = wide if wide is not None else _graph.run_wide(run)
    folding = _fold.plan_from_store(wide.shapes, tolerance, keep=keep)
    if not folding.folded_ranks:
        return _graph.build(run), None
    reps = sorted(set(folding.representative.values()))
    return _fold.fold_built(_graph.build(run, reps, wide=wide), folding), folding


def replay(store_or_run, scenario=None, *, ranks=None, compiled: bool | None = None, graph=None, fold="auto",
           fold_tolerance: float = 0.05, wide=None) -> ReplayResult:
    """Replay a run (a trace directory, a store directory or a tracekit Run), optionally under a what-if
    scenario (a Scenario or a scenario file path). fold: True / False / "auto" (more than 64 ranks):
    replay ranks whose graphs are identical up to fold_tolerance once (replay/fold.py); a replay of every
    rank (no graph, no ranks given) plans the classes from the store and builds only the representatives'
    graph; a replay.fold.Folding: its classes, cut from the graph of every rank. wide: depgraph.run_wide(run),
    when several replays of the run share it. Returns a ReplayResult."""
    run = _open(store_or_run)
    scen = _scenario(scenario)  # a bad scenario file fails before any work
    t = time.perf_counter()
    own = set(scen.compute.rank_slowdown) if scen is not None else set()  # ranks a scenario changes on their own
    if graph is None and ranks is None and folds(run, fold, wide):
        g, folding = _fold_first(run, wide, fold_tolerance, own)
    else:
        g, folding = _fold_graph(graph if graph is not None else _graph.build(run, ranks), fold, fold_tolerance, own)
    build_s = time.perf_counter() - t
    dur, lag, model_notes, info = apply_models(g, scen, run)
    t = time.perf_counter()
    # a model may re-route edges (gloo's worker pool frees jobs from their thread order): same edges, new sources
    src = g.src if info.edge_src is None else info.edge_src
    from_end = g.from_end if info.edge_from_end is None else info.edge_from_end
    eng = Engine(g.n_nodes, src, g.dst, from_end, g.lag_ns, source=0, t0_ns=g.origin_ns, compiled=compiled)
    sched = eng.run(dur, lag, flows=info.flows, pools=info.pools)
    replay_s = time.perf_counter() - t
    res = ReplayResult(graph=g, start_ns=sched.start_ns, end_ns=sched.end_ns, steps=pd.DataFrame(), run=run,
                       scenario=scen, build_s=build_s, replay_s=replay_s, notes=list(g.notes) + model_notes)
    res.info = info
    res.folding = folding
    res.steps = _steps(res)
    if info.hardware is not None:  # a step that waits on its host does not follow its kernels: say so
        from .hardware import bound_notes

        res.notes += bound_notes(res)
    if info.step_scale is not None:  # a re-layout re-times every step by its formula's ratio (replay/relayout.py)
        start = res.steps.predicted_end_ns - res.steps.predicted_step_ns
        first = start.groupby(res.steps["rank"]).transform("min")
        res.steps["predicted_step_ns"] = np.rint(res.steps.predicted_step_ns * info.step_scale).astype(np.int64)
        res.steps["predicted_end_ns"] = first + res.steps.groupby("rank").predicted_step_ns.cumsum()
    return res


def _scenario(scenario) -> Scenario | None:
    if scenario is None or isinstance(scenario, Scenario):
        return scenario
    from .scenario import load_scenario

    return load_scenario(scenario)


def _steps(res: ReplayResult) -> pd.DataFrame:
    g = res.graph
    st = g.steps
    if st.empty:  # no ProfilerStep: the whole replayed span of each rank is one step
        rows = []
        for r in g.ranks:
            ids = np.flatnonzero(g.rank == r)
            if len(ids):
                m0, m1 = g.start_ns[ids].min(), (g.start_ns[ids] + g.dur_ns[ids]).max()
                p0, p1 = res.start_ns[ids].min(), res.end_ns[ids].max()
                rows.append({"rank": r, "step": -1, "is_last": True, "measured_step_ns": int(m1 - m0),
                             "predicted_step_ns": int(p1 - p0), "measured_end_ns": int(m1 - g.origin_ns),
                             "predicted_end_ns": int(p1 - g.origin_ns)})
        if "no ProfilerStep annotations: each rank's whole span is one step" not in res.notes:
            res.notes.append("no ProfilerStep annotations: each rank's whole span is one step")
        return pd.DataFrame(rows, columns=list(STEP_COLUMNS))
    replayed = st[st["rank"].isin(g.ranks)]
    ts = replayed.ts_ns.to_numpy(np.int64)
    end = replayed.end_ns.to_numpy(np.int64)
    new_ts, new_end = res._warp(replayed[["rank", "pid", "tid"]], ts, end)
    pred = pd.DataFrame({"rank": replayed["rank"].to_numpy(np.int64), "step": replayed.step.to_numpy(np.int64),
                         "predicted_step_ns": new_end - new_ts, "predicted_end_ns": new_end - g.origin_ns})
    out = st[["rank", "step", "is_last"]].copy()
    out["measured_step_ns"] = (st.end_ns - st.ts_ns).to_numpy(np.int64)
    out["measured_end_ns"] = (st.end_ns - g.origin_ns).to_numpy(np.int64)
    rep = res.folding.representative if res.folding is not None else {}
    out["_rep"] = [rep.get(int(r), int(r)) for r in out["rank"]]
    out = out.merge(pred.rename(columns={"rank": "_rep"}), on=["_rep", "step"], how="left")
    return out.drop(columns="_rep")[list(STEP_COLUMNS)].astype({"predicted_step_ns": "int64", "predicted_end_ns": "int64"})
