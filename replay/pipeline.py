"""Tensor- and pipeline-parallel what-ifs from a run's layer structure.

Inputs (refused with a message naming what is missing):
  - layer annotations `layer.<i>` in the trace (record_function around each layer's forward: the
    demo trainer writes them; Megatron-style code can add them in a forward hook), a `backward`
    annotation around loss.backward(), and the forward annotation DDP records
    (`DistributedDataParallel.forward`, or a `forward` annotation);
  - run.json's `parallel` block with `activation_bytes` (what a layer hands the next one per rank and
    step) and today's `tp = 1`, `pp = 1` (splitting a model that is already split is not modelled).

Per rank, from the profiled steps (medians): each layer's forward time F_l (its annotation), the rest
of the forward F_o (embedding, head), the backward's busy CPU/GPU time B, split over the layers in
proportion to their forward time (a layer's backward costs about twice its forward, for every layer
alike), and the data-parallel all-reduce's measured transfer W.

  tp = T  every layer's forward and backward / T; per layer and micro-batch two all-reduces in the
          forward and two in the backward (Megatron's attention and MLP blocks) of the layer's
          activations over T ranks, costed by the run's calibrated network model; gradient bytes / T.
  pp = P, micro_batches = m
          layers split into P contiguous stages of equal layer count (embedding with the first, head
          with the last); each micro-batch's work is 1/m of the stage's; activations (and their
          gradients) go stage to stage as send/recv of activation_bytes / m, costed by the model; the
          1F1B schedule is replayed with the discrete-event engine; gradient bytes / P.
The predicted step is the replayed step minus the measured forward and backward, plus the new
schedule's makespan, with the data-parallel all-reduce re-costed for the smaller gradient share.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from analyses.intervals import union_ns
from tracekit.capture.pipeline_demo import schedule  # the 1F1B order the recorder runs
from tracekit.errors import TracekitError

from .engine import Engine

_FORWARD = ("DistributedDataParallel.forward", "forward")


def one_f_one_b(f_ns, b_ns, p2p_ns: int, micro_batches: int) -> int:
    """Makespan of one 1F1B pipeline step: stage s runs min(P - s - 1, m) forwards, then alternates one
    forward and one backward, then drains its backwards. f_ns[s], b_ns[s]: one micro-batch's forward and
    backward on stage s; p2p_ns: one activation (or gradient) transfer between neighbouring stages."""
    P, m = len(f_ns), int(micro_batches)
    if P < 1 or m < 1:
        raise ValueError("need at least one stage and one micro-batch")
    ids = {}
    n = 1  # node 0 is the origin
    dur = [0]
    for s in range(P):
        for i in range(m):
            for kind, d in (("F", f_ns[s]), ("B", b_ns[s])):
                ids[(kind, s, i)] = n
                dur.append(int(d))
                n += 1
            if s < P - 1:
                for kind in ("SF", "SB"):  # forward activation s -> s+1, gradient s+1 -> s
                    ids[(kind, s, i)] = n
                    dur.append(int(p2p_ns))
                    n += 1
    src, dst = [], []

    def edge(a, b):
        src.append(a)
        dst.append(b)

    for s in range(P):
        order = schedule(s, P, m)
        prev = 0
        for kind, i in order:  # the stage's program order
            edge(prev, ids[(kind, s, i)])
            prev = ids[(kind, s, i)]
        for i in range(m):
            if s < P - 1:
                edge(ids[("F", s, i)], ids[("SF", s, i)])
                edge(ids[("SF", s, i)], ids[("F", s + 1, i)])
                edge(ids[("B", s + 1, i)], ids[("SB", s, i)])
                edge(ids[("SB", s, i)], ids[("B", s, i)])
            else:
                edge(ids[("F", s, i)], ids[("B", s, i)])
    for key, node in ids.items():  # transfers hang off the origin too (their real deps follow)
        if key[0] in ("SF", "SB"):
            edge(0, node)
    e = Engine(n, src, dst, np.ones(len(src), bool), np.zeros(len(src), np.int64), source=0, t0_ns=0)
    sched = e.run(np.asarray(dur, np.int64))
    return int(sched.end_ns.max())


def layer_profile(run, ranks) -> pd.DataFrame:
    """Per rank (medians over the profiled steps but the last): forward_ns, layers_ns (list), backward_ns
    (busy time inside the backward annotation on its thread), step_ns."""
    p = {"ranks": list(ranks)}
    ann = run.sql("""
        WITH s AS (SELECT rank, step, ts_ns, end_ns FROM steps WHERE NOT is_last AND rank IN (SELECT unnest($ranks::BIGINT[]))),
        a AS (SELECT e.rank, s.step, e.name, e.tid, e.ts_ns, e.dur_ns FROM events e
              JOIN s ON e.rank = s.rank AND e.ts_ns >= s.ts_ns AND e.ts_ns < s.end_ns
              WHERE e.ph = 'X' AND e.cat = 'user_annotation'
                AND (regexp_matches(e.name, '^layer\\.[0-9]+$') OR e.name IN ('backward', 'forward',
                     'DistributedDataParallel.forward')))
        SELECT * FROM a ORDER BY rank, step, ts_ns""", p)
    if ann.empty or not ann.name.str.startswith("layer.").any():
        raise TracekitError("[parallelism] tp/pp: the trace has no layer.<i> annotations (record_function around each "
                            "layer's forward), so there is no layer structure to split")
    if not (ann.name == "backward").any() or not ann.name.isin(_FORWARD).any():
        raise TracekitError("[parallelism] tp/pp: the trace needs a 'backward' annotation around loss.backward() and a "
                            "forward annotation (DistributedDataParallel.forward or 'forward') to time the model")
    busy = run.sql("""
        WITH b AS (SELECT e.rank, e.tid, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns FROM events e
                   JOIN steps s ON e.rank = s.rank AND e.ts_ns >= s.ts_ns AND e.ts_ns < s.end_ns
                   WHERE e.ph = 'X' AND e.cat = 'user_annotation' AND e.name = 'backward' AND NOT s.is_last
                     AND e.rank IN (SELECT unnest($ranks::BIGINT[]))),
        ops AS (SELECT o.rank, b.ts_ns AS bw, o.ts_ns, o.ts_ns + o.dur_ns AS end_ns FROM events o
                JOIN b ON o.rank = b.rank AND o.tid = b.tid AND o.ts_ns >= b.ts_ns AND o.ts_ns < b.end_ns
                WHERE o.ph = 'X' AND (o.cat = 'cpu_op' OR is_device_runtime(o.cat)))
        SELECT rank, bw, ts_ns, end_ns FROM ops ORDER BY rank, bw, ts_ns""", p)
    rows = []
    steps = run.sql("SELECT rank, median(dur_ns) AS step_ns FROM steps WHERE NOT is_last GROUP BY rank")
    step_of = dict(zip(steps["rank"].astype(int), steps.step_ns))
    for r, g in ann.groupby("rank"):
        per_step = []
        for _st, x in g.groupby("step"):
            layers = x[x.name.str.startswith("layer.")]
            idx = layers.name.str.slice(6).astype(int).to_numpy()
            lay = np.zeros(idx.max() + 1 if len(idx) else 0)
            np.add.at(lay, idx, layers.dur_ns.to_numpy(float))
            fwd = x[x.name.isin(_FORWARD)].dur_ns.sum()
            per_step.append((lay, float(fwd)))
        n_layers = max(len(p_[0]) for p_ in per_step)
        lay = np.median(np.stack([np.pad(p_[0], (0, n_layers - len(p_[0]))) for p_ in per_step]), axis=0)
        fwd = float(np.median([p_[1] for p_ in per_step]))
        bb = busy[busy["rank"] == r]
        per_bw = []
        for _bw, y in bb.groupby("bw"):  # union of the top-level ops' spans inside each backward
            per_bw.append(float(union_ns(y.ts_ns.to_numpy(np.int64), y.end_ns.to_numpy(np.int64))))
        rows.append({"rank": int(r), "forward_ns": fwd, "layers_ns": lay.tolist(),
                     "backward_ns": float(np.median(per_bw)) if per_bw else 0.0, "step_ns": float(step_of.get(int(r), 0))})
    return pd.DataFrame(rows)


def _cost(calibrated, op: str, n_bytes: float, group: int, hosts: int) -> int:
    if calibrated is None or group <= 1 or n_bytes <= 0:
        return 0
    from .costs import colls_frame

    df = colls_frame([{"op": op, "bytes": int(n_bytes), "group_size": int(group), "n_hosts": int(hosts),
                       "measured_transfer_ns": 0}], timeline="cpu")
    return int(calibrated.transfer_ns(df)[0])


def step_delta(run, g, par, lay: dict, calibrated, gpus_per_node=None) -> tuple[dict, list[str]]:
    """Per rank: predicted step change (ns) under the tp / pp / micro_batches of par (a
    replay.specs.ParallelismSpec; None keeps 1); and notes."""
    T = int(par.tp or 1)
    P = int(par.pp or 1)
    m = int(par.micro_batches or 1)
    if not lay:
        raise TracekitError("[parallelism] tp/pp: the run's layout is unknown: it needs run.json with a 'parallel' "
                            "block (written by `tracekit record` / `demo-train`)")
    if lay.get("tp", 1) != 1 or lay.get("pp", 1) != 1:
        raise TracekitError("[parallelism] tp/pp: the run is already split (run.json tp/pp > 1); only a run with "
                            "tp = 1 and pp = 1 can be split here")
    prof = layer_profile(run, g.ranks)
    act = lay.get("activation_bytes")
    if not act:
        raise TracekitError("[parallelism] tp/pp: run.json's parallel block has no activation_bytes (bytes a layer "
                            "hands the next per rank and step)")
    if P > 1 and m < 1:
        raise TracekitError("[parallelism] micro_batches must be >= 1")
    n_layers = len(prof.layers_ns.iloc[0])
    if P > n_layers:
        raise TracekitError(f"[parallelism] pp = {P}: the model has {n_layers} layers; at most {n_layers} stages")
    grad = lay.get("model_bytes")
    dp_groups = g.colls[g.colls.op == "all_reduce"] if len(g.colls) else g.colls
    W = float(dp_groups.measured_transfer_ns.median()) if len(dp_groups) else 0.0
    tp_hosts = 1 if not gpus_per_node else -(-T // int(gpus_per_node))
    dp = int(lay.get("dp", 1))
    W_new = W
    if grad and W > 0 and calibrated is not None and dp > 1:
        hosts = int(dp_groups.n_hosts.dropna().iloc[0]) if dp_groups.n_hosts.notna().any() else 1
        old = _cost(calibrated, "all_reduce", grad, dp, hosts)
        new = _cost(calibrated, "all_reduce", grad / (T * P), dp, hosts)
        W_new = W * new / old if old > 0 else W
    tp_ar = _cost(calibrated, "all_reduce", act / m, T, tp_hosts) if T > 1 else 0
    p2p = _cost(calibrated, "send", act / m, 2, 2) if P > 1 else 0
    delta, notes = {}, []
    for row in prof.itertuples(index=False):
        F_l = np.asarray(row.layers_ns, float)
        F = max(row.forward_ns, F_l.sum())
        F_o = F - F_l.sum()
        B = row.backward_ns
        B_l, B_o = (B * F_l / F, B * F_o / F) if F > 0 else (np.zeros_like(F_l), 0.0)
        F_l, B_l = F_l / T, B_l / T
        bounds = np.linspace(0, n_layers, P + 1).round().astype(int)
        f_s, b_s = [], []
        for s in range(P):
            sl = slice(bounds[s], bounds[s + 1])
            layers_here = bounds[s + 1] - bounds[s]
            fo = F_o / 2 * ((s == 0) + (s == P - 1))
            bo = B_o / 2 * ((s == 0) + (s == P - 1))
            f_s.append((F_l[sl].sum() + fo) / m + 2 * layers_here * tp_ar)
            b_s.append((B_l[sl].sum() + bo) / m + 2 * layers_here * tp_ar)
        makespan = one_f_one_b(f_s, b_s, p2p, m)
        delta[int(row.rank)] = int(round(makespan - (F + B) + (W_new - W)))
    notes.append(f"tensor parallelism 1 -> {T}, pipeline 1 -> {P} with {m} micro-batch(es): per-layer compute from "
                 f"{n_layers} layer annotations split {T}-way, 1F1B over {P} stage(s) replayed by the engine; "
                 f"TP all-reduce {tp_ar / 1e3:.1f} us, stage-to-stage send {p2p / 1e3:.1f} us per micro-batch; "
                 f"data-parallel all-reduce {W / 1e6:.2f} -> {W_new / 1e6:.2f} ms")
    return delta, notes
