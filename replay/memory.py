"""[memory] and [batch]: activation checkpointing, the optimizer's state offloaded to the host and the global batch,
re-timed on the run's own ops (the step time) and attributed on its allocations (the peak, predict_peak).

What the trace shows, per graph node (op_facts):
- its phase: backward (autograd's `evaluate_function: ...` nodes), optimizer (inside an `Optimizer.step#` or
  `Optimizer.zero_grad#` range), else forward and the rest;
- whether it works on the step's tokens: its op, or one nested in it, reads a tensor of two or more dimensions that
  is not a parameter's shape (the parameters' shapes are those the optimizer's update reads, else those autograd's
  `AccumulateGrad` records), or it is an ATen operator reading an index tensor (an integer one of more than one
  element: token ids, a loss's targets; no parameter is one). Those ops
  follow the tokens a rank holds; the optimizer, gradient accumulation, DDP's and FSDP's copies of flat buffers do not;
- the ops in it, for the run's own per-op floor: the median time of the rank's ops that move no data (views,
  transposes, ...); an op's floor does not scale, the rest of its time does;
- the share of its time inside ATen operators (the outermost ones on its thread, over its own span: a piece of
  an event cut where a nested node or a wait took the thread holds only its part; all of it for an operator, but a
  tensor subclass's dispatch around the operators it runs: DTensor's, dispatch_ns): the rest, a backward node's
  autograd engine and hooks, DTensor's sharding propagation and its operators' way into Python, is what no tensor's
  size moves;
- checkpoint recompute nested in it: a backward node whose nested ops carry an autograd sequence number ran a
  forward again (inside a backward, only a recompute builds autograd nodes);
- the repeated blocks of the forward: the smallest period of the forward's op-name sequence whose repeats cover
  most of its ops (Lumos' layer grouping, found without annotations).

The batch scale s: a token-following op takes floor + (t - floor) x s (GPU kernels: the rank's smallest kernel as
the floor; a GPU rank's CPU ops launch and do not scale; a CPU node's time outside ATen operators, a backward node's
autograd engine and checkpoint hooks, DTensor's dispatch, is floor too); a collective whose tensors carry the tokens
(tensor parallelism's all-reduces, a pipeline's sends) carries s x its bytes; a gradient or parameter collective is
unchanged. Checkpointing "full" on a run without it adds the blocks' ops and the collectives carrying tokens in them
(tensor parallelism's) to the backward (each backward node's time x (1 + recompute / backward), per rank); "none" on
a checkpointed run takes the nested recompute out of the nodes that ran it (its ATen operators and the Python around
them: _recompute_python_ns), and its collectives carry nothing. Not modelled: the hooks a checkpoint adds to every
op and backward node of its blocks (pack and unpack, Python: see docs/whatif.md), in either direction.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analyses import depgraph as _graph
from analyses.intervals import covered_ns, island_heads, union_spans
from tracekit.store.devices import sql_in

CHECKPOINTING = ("none", "full")

FORWARD, BACKWARD, OPTIMIZER, OTHER = 1, 2, 3, 0
BACKWARD_PREFIX = "autograd::engine::evaluate_function:"
# ops that move no data: their median time is the run's per-op floor
VIEW_OPS = ("aten::view", "aten::reshape", "aten::transpose", "aten::t", "aten::as_strided", "aten::slice",
            "aten::select", "aten::expand", "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::detach",
            "aten::_unsafe_view", "aten::alias", "aten::empty")
# Kineto's names of the integer types an index tensor has (token ids, targets, positions)
INDEX_TYPES = ("long int", "int")
# the calls of a collective on a CPU thread: c10d operators, functional collectives, gloo's and NCCL's annotations
COLL_CALL_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::", "gloo:", "nccl:", "record_param_comms")
# a block's repeats must cover at least this share of the forward's ops that the best period covers
BLOCK_COVERAGE = 0.9
# the longest block the forward's op sequence is searched for (a transformer layer's top-level ops are tens to a few
# hundred; the search costs n x periods a step)
MAX_BLOCK_OPS = 2048
# the most consecutive ops in which two copies of a block may differ (operators the graph shows as pieces or not by
# their timing: a collective's call and the wrap or view beside it) and still be one repeat
REPEAT_SLACK_OPS = 2

_EVENTS_SQL = """
WITH opt AS (
    SELECT rank, ts_ns, ts_ns + dur_ns AS end_ns FROM events
    WHERE ph = 'X' AND cat = 'user_annotation' AND starts_with(name, 'Optimizer.step#')),
upd AS (
    SELECT e.rank, json_extract(e.input_dims, '$[0]') AS a FROM events e
    JOIN opt o ON e.rank = o.rank AND e.ts_ns >= o.ts_ns AND e.ts_ns < o.end_ns
    WHERE e.ph = 'X' AND e.name IN ('aten::addcdiv_', 'aten::_foreach_addcdiv_', 'aten::_fused_adam_',
                                    'aten::_fused_adamw_') AND e.input_dims IS NOT NULL),
p_opt AS (
    SELECT rank, list(DISTINCT shape) AS shapes FROM (
        SELECT rank, unnest(CASE WHEN json_type(json_extract(a, '$[0]')) = 'ARRAY'
                                 THEN CAST(json_transform(a, '["JSON"]') AS VARCHAR[]) ELSE [a::VARCHAR] END) AS shape
        FROM upd)
    GROUP BY rank),
p_acc AS (
    SELECT rank, list(DISTINCT json_extract(input_dims, '$[0]')::VARCHAR) AS shapes
    FROM events WHERE ph = 'X' AND name = 'torch::autograd::AccumulateGrad' AND input_dims IS NOT NULL
    GROUP BY rank),
-- the parameters' shapes: what the optimizer updates (a pipeline stage's received activation is a leaf that
-- AccumulateGrad also records), else what AccumulateGrad records
p AS (
    SELECT rank, coalesce(p_opt.shapes, p_acc.shapes) AS shapes
    FROM p_acc FULL JOIN p_opt USING (rank))
-- an op follows the tokens when it reads a tensor of two or more dimensions of no parameter's shape, or is an
-- ATen operator reading an index tensor (integer, more than one element: token ids, a loss's targets), which no
-- parameter is: a loss's logits may have a weight's shape (128 tokens of a 512-word vocabulary and a 128 x 512
-- linear). Not a collective's: DDP broadcasts its rebuilt buckets' indices
SELECT e.rank, e.tid, e.event_id, e.cat, e.name, e.ts_ns, e.dur_ns, coalesce(e.sequence_number, -1) AS seq,
       coalesce(len(list_filter(list_zip(CAST(json_transform(e.input_dims, '["JSON"]') AS VARCHAR[]),
                                         CAST(json_transform(coalesce(e.input_types, '[]'), '["VARCHAR"]')
                                              AS VARCHAR[])),
                                lambda x: (json_array_length(x[1]) >= 2
                                           AND NOT list_contains(coalesce(p.shapes, []), x[1]))
                                          OR (starts_with(e.name, 'aten::') AND x[2] IN {index_types}
                                              AND json_array_length(x[1]) >= 1 AND x[1] <> '[1]'))) > 0,
                false) AS act
FROM events e LEFT JOIN p USING (rank)
WHERE e.ph = 'X' AND e.cat IN ('cpu_op', 'user_annotation', 'cuda_runtime', 'cuda_driver')
  AND e.dur_ns IS NOT NULL
"""
_EVENTS_SQL = _EVENTS_SQL.format(index_types=sql_in(INDEX_TYPES))


@dataclass
class OpFacts:
    """Per graph node what the memory and batch what-ifs need (module docstring)."""
    phase: np.ndarray  # int8 FORWARD | BACKWARD | OPTIMIZER | OTHER
    act: np.ndarray  # bool: follows the step's tokens
    n_ops: np.ndarray  # int64: ops in it (itself and nested)
    # float: the share of its time inside ATen operators; the rest (autograd's engine, Python, a checkpoint's hooks
    # around the ops of a backward node) does not follow the tokens
    aten_share: np.ndarray
    recompute_ns: np.ndarray  # int64: checkpoint recompute nested in it
    block_ns: np.ndarray  # int64: its time when it is a forward node inside a repeated block
    floor_ns: dict  # rank -> per-op floor (CPU ops), ns
    kernel_floor_ns: dict  # rank -> smallest compute kernel, ns (GPU ranks)
    coll_act: np.ndarray  # per collective row of g.colls: its tensors carry the tokens
    coll_recompute: np.ndarray  # per collective row: called inside a checkpoint recompute
    # rank, tid, start, end of each recompute (outermost op); seq and fwd_ts: the sequence number of the backward
    # node it runs in and when the forward ran that node's op (-1: not known)
    recompute_spans: pd.DataFrame
    # the memory analyses the what-if reads (memory_blocks, memory_breakdown, the allocator's series), each read
    # once: _memory_analysis
    analyses: dict = field(default_factory=dict)
    # rank -> (period of the forward's blocks, what recomputing them takes, the backward's time, steps) over its
    # whole steps
    blocks: dict = field(default_factory=dict)
    # per node: whether it is an operator held by another node's (the graph cut its parent into pieces around it),
    # and the name of the operator it stands for in the forward's sequence (op_facts; _block_repeat)
    nested: np.ndarray | None = None
    op_name: np.ndarray | None = None
    # rank, tid, start, end of each collective call whose tensors carry the tokens (a pipeline's send of an
    # activation, tensor parallelism's all-reduce): the communication buffers made in them follow the batch
    token_calls: pd.DataFrame | None = None
    # float per node: its ns in a tensor subclass's dispatch, outside the operators it runs (_operator_split_ns;
    # neither aten_share's nor the tokens')
    dispatch_ns: np.ndarray | None = None

    @property
    def checkpointed(self) -> bool:
        return bool(self.recompute_ns.any())


def op_facts(run, g) -> OpFacts:
    ev = run.sql(_EVENTS_SQL)
    opt = run.sql("SELECT rank, ts_ns, ts_ns + dur_ns AS end_ns FROM events WHERE ph = 'X' AND "
                  "(name LIKE 'Optimizer.step#%' OR name LIKE 'Optimizer.zero_grad#%')")
    n = len(g.kind)
    phase = np.zeros(n, np.int8)
    act = np.zeros(n, bool)
    nested = np.zeros(n, bool)
    op_name = g.name.astype(object).copy()
    n_ops = np.ones(n, np.int64)
    aten_share = np.ones(n)
    dispatch = np.zeros(n)
    recompute = np.zeros(n, np.int64)
    floor, kfloor = {}, {}
    recompute_spans = []  # (rank, tid, start, end) of each recompute
    cpu = g.kind == _graph.K["cpu"]
    rt = g.kind == _graph.K["runtime"]
    names = g.name.astype(object)
    is_bwd = np.array([isinstance(s, str) and s.startswith(BACKWARD_PREFIX) for s in names])
    key_ev = pd.MultiIndex.from_arrays([ev["rank"].to_numpy(np.int64), ev["event_id"].to_numpy(np.int64)])
    ev_act = pd.Series(ev["act"].to_numpy(bool), index=key_ev)
    host_nodes = {int(r): np.flatnonzero((g.rank == r) & (cpu | rt)) for r in np.unique(g.rank[cpu | rt])}
    for (rank, tid), e in ev.groupby(["rank", "tid"], sort=False):
        e = e.sort_values(["ts_ns", "dur_ns"], ascending=[True, False])
        ids = e.event_id.to_numpy(np.int64)
        ts = e.ts_ns.to_numpy(np.int64)
        end = ts + e.dur_ns.to_numpy(np.int64)
        mine = host_nodes.get(int(rank), np.zeros(0, np.int64))
        sel = mine[np.isin(g.event_id[mine], ids)]
        if not len(sel):
            continue
        pos = pd.Index(ids).get_indexer(g.event_id[sel])
        # the top-level node events of this thread, in time order, and which of them holds each event
        tops = np.unique(pos)
        tops = tops[np.argsort(ts[tops], kind="stable")]
        # the operator each node event stands for in the forward's sequence (_block_repeat): the outermost event
        # holding it on the thread (e is sorted by start, the longer first at a tie); a node inside another node is
        # nested, and of the nodes inside an operator that has none of its own (a wait cut its start away) the
        # first stands for it, with its name and whether it follows the tokens
        nm = e.name.to_numpy(object)
        a = e.act.to_numpy(bool)
        oi = np.flatnonzero(e.cat.to_numpy(object) == "cpu_op")  # operators: not the step's or a module's ranges
        outer_ev = oi[island_heads(ts[oi], end[oi])]
        outer = np.arange(len(ts))
        if len(outer_ev):  # a thread of runtime calls or annotations only has none
            k = np.searchsorted(outer_ev, outer, side="right") - 1
            ko = outer_ev[np.maximum(k, 0)]
            held = (k >= 0) & ((ts < end[ko]) | (outer == ko))
            outer[held] = ko[held]
        outer_act = np.zeros(len(ts), bool)
        np.logical_or.at(outer_act, outer, a)
        o = outer[tops]
        stands = (o != tops) & ~np.isin(o, tops)
        stands &= np.concatenate(([True], o[1:] != o[:-1]))  # the first node inside it
        top_nested = (o != tops) & ~stands
        top_name = np.where(stands, nm[o], nm[tops])
        at = np.searchsorted(ts[tops], ts, side="right") - 1
        inside = (at >= 0) & (ts < end[tops[np.maximum(at, 0)]])
        inside |= (at >= 0) & (ts == ts[tops[np.maximum(at, 0)]])
        holder = np.where(inside, at, -1)
        any_act = np.zeros(len(tops), bool)
        np.logical_or.at(any_act, holder[holder >= 0], a[holder >= 0])
        any_act |= stands & outer_act[o]
        count = np.bincount(holder[holder >= 0], minlength=len(tops))
        # the time of each node inside ATen operators, over the node's own span (a piece of an event, cut where a
        # nested node or a wait took the thread, holds only its part): the thread's outermost ATen events', less a
        # tensor subclass's dispatch (DTensor's aten::addmm -> PythonSubclass -> aten::addmm on the local shard: all
        # but the local operator is dispatch, whatever the tokens), which is the node's dispatch_ns
        n0 = g.start_ns[sel].astype(np.int64)
        n1 = n0 + g.dur_ns[sel].astype(np.int64)
        aten_ns, dispatch_ns = _operator_split_ns(nm, ts, end, n0, n1)
        node_share = np.where(n1 > n0, np.clip(aten_ns / np.maximum(n1 - n0, 1), 0.0, 1.0), 1.0)
        # checkpoint recompute: ops with an autograd sequence number nested in a backward node (not the node's own
        # autograd events), the outermost of them
        seq = e.seq.to_numpy(np.int64)
        top_bwd = np.array([isinstance(nm[t], str) and nm[t].startswith(BACKWARD_PREFIX) for t in tops])
        cand = np.flatnonzero((holder >= 0) & (seq >= 0))
        cand = cand[top_bwd[holder[cand]] & ~np.isin(np.arange(len(ids))[cand], tops)]
        rec = np.zeros(len(tops), np.int64)
        heavy = np.zeros(len(tops), bool)  # a recompute runs the forward's own ops, not only autograd Functions
        spans = []
        last_end = -1
        for i in cand:
            name = nm[i]
            if not isinstance(name, str) or "Backward" in name or name.startswith(("torch::autograd::", "autograd::")):
                continue
            if ts[i] >= last_end:
                rec[holder[i]] += end[i] - ts[i]
                heavy[holder[i]] |= name.startswith("aten::") and name not in VIEW_OPS
                spans.append((holder[i], ts[i], end[i]))
                last_end = end[i]
        rec[~heavy] = 0
        first = {}
        for h, a0, a1 in spans:  # one recompute a backward node: from its first recomputed op to its last
            if heavy[h]:
                b0, b1 = first.get(h, (a0, a1))
                first[h] = (min(a0, b0), max(a1, b1))
        # the backward node each recompute runs in: its autograd node's sequence number, the forward op's
        bseq = {}
        for i in np.flatnonzero(holder >= 0):
            h = holder[i]
            if h in first and h not in bseq and seq[i] >= 0 and isinstance(nm[i], str) and "Backward" in nm[i]:
                bseq[h] = int(seq[i])
        recompute_spans += [(int(rank), int(tid), int(a0), int(a1), bseq.get(h, -1)) for h, (a0, a1) in first.items()]
        where_top = pd.Index(tops).get_indexer(pos)
        act[sel] = any_act[where_top]
        nested[sel] = top_nested[where_top]
        op_name[sel] = top_name[where_top]
        n_ops[sel] = count[where_top]
        aten_share[sel] = node_share
        dispatch[sel] = np.clip(dispatch_ns, 0, n1 - n0)
        recompute[sel] = rec[where_top]
        views = np.isin(nm, VIEW_OPS)
        if views.any():
            floor[int(rank)] = min(floor.get(int(rank), np.inf), float(np.median(end[views] - ts[views])))
        # phases
        o = opt[opt["rank"] == rank]
        in_opt = np.zeros(len(sel), bool)
        for s0, s1 in zip(o.ts_ns.to_numpy(np.int64), o.end_ns.to_numpy(np.int64)):
            in_opt |= (g.start_ns[sel] >= s0) & (g.start_ns[sel] < s1)
        ph = np.where(is_bwd[sel], BACKWARD, np.where(in_opt, OPTIMIZER, np.where(act[sel], FORWARD, OTHER)))
        phase[sel] = ph
    # the pieces of one event share its facts; a recompute is split over the pieces by their time
    _spread_over_pieces(g, recompute)
    # GPU kernels: their launch's facts; the rank's smallest compute kernel is its floor
    gpu = g.kind == _graph.K["gpu"]
    if gpu.any():
        launch = np.flatnonzero(g.edge_kind == _graph.E["launch"])
        src, dst = g.src[launch], g.dst[launch]
        act[dst] = act[src]
        phase[dst] = phase[src]
        nodes = g.nodes()
        comp = gpu & (nodes.kernel_class.to_numpy(object) == "compute")
        for r in np.unique(g.rank[comp]):
            kfloor[int(r)] = float(np.min(g.dur_ns[comp & (g.rank == r)]))
    coll_act = np.zeros(len(g.colls), bool)
    coll_rec = np.zeros(len(g.colls), bool)
    spans = pd.DataFrame(recompute_spans, columns=["rank", "tid", "start", "end", "seq"])
    # where the forward ran the op whose backward node ran each recompute (-1: not known)
    spans["fwd_ts"] = -1
    if len(spans):
        fwd = ev[ev.seq.isin(spans.seq[spans.seq >= 0]) & ~ev.name.str.contains("Backward", regex=False, na=True)
                 & ~ev.name.str.startswith(("autograd::", "torch::autograd::"), na=True)]
        first_ts = fwd.groupby(["rank", "seq"]).ts_ns.min()
        spans["fwd_ts"] = [int(first_ts.get((r, q), -1)) for r, q in zip(spans["rank"], spans.seq)]
    if len(g.colls):
        cols = g.colls[["present_ranks", "events", "arrivals", "callers"]].itertuples(index=False)
        for i, (ranks, evs, arrivals, callers) in enumerate(cols):
            coll_act[i] = any(bool(ev_act.get((int(r), int(x)), False)) for r, x in zip(ranks, evs))
            if len(spans) and coll_act[i]:  # a forward's token collective, called inside a recompute
                for (r, _, tid), t in zip(callers, arrivals):
                    sp = spans[(spans["rank"] == r) & (spans.tid == tid)]
                    coll_rec[i] |= bool(((sp.start <= t) & (t < sp.end)).any())
    calls = ev[ev.act.astype(bool)]
    calls = calls[calls.name.str.startswith(COLL_CALL_PREFIXES, na=False)]
    token_calls = pd.DataFrame({"rank": calls["rank"].to_numpy(np.int64), "tid": calls.tid.to_numpy(np.int64),
                                "start": calls.ts_ns.to_numpy(np.int64),
                                "end": (calls.ts_ns + calls.dur_ns).to_numpy(np.int64)})
    facts = OpFacts(phase, act, n_ops, aten_share, recompute, np.zeros(n, np.int64), floor, kfloor, coll_act,
                    coll_rec, spans, nested=nested, op_name=op_name, token_calls=token_calls, dispatch_ns=dispatch)
    _blocks(g, facts)
    return facts


def _operator_split_ns(names: np.ndarray, ts: np.ndarray, end: np.ndarray, w0: np.ndarray,
                       w1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per window [w0, w1) of one thread, (the ns its events spend in ATen operators, the ns they spend in a tensor
    subclass's dispatch) (names, ts, end: one thread's events, sorted by start). The dispatch is the time of the
    subclass's operators (an ATen event that holds a PythonSubclass: DTensor's aten::addmm, or aten::linear around
    DTensor's aten::t and aten::addmm) and of PythonSubclass, less the ATen operators PythonSubclass runs (the local
    shard's): sharding propagation, the dispatcher's way into Python and back, spent whatever the tokens and only by
    a layout that has the subclass. ATen time is the rest of the union of the ATen and PythonSubclass events; the rest
    of a window is neither (autograd's engine, hooks)."""
    name = pd.Series(names, dtype=object)
    ai = np.flatnonzero(name.str.startswith("aten::", na=False).to_numpy(bool))
    pi = np.flatnonzero((name == "PythonSubclass").to_numpy(bool))
    both = np.sort(np.concatenate((ai, pi)))
    got = covered_ns(*union_spans(ts[both], end[both]), w0, w1)
    if not len(pi):
        return got, np.zeros(len(got))
    p0, p1 = union_spans(ts[pi], end[pi])
    k = np.searchsorted(p0, ts[ai], side="right") - 1
    in_p = (k >= 0) & (ts[ai] < p1[np.maximum(k, 0)])
    holds = np.searchsorted(ts[pi], ts[ai], side="left") < np.searchsorted(ts[pi], end[ai], side="left")  # ts sorted
    outer = np.sort(np.concatenate((ai[holds & ~in_p], pi)))
    local = ai[in_p]
    dispatch = covered_ns(*union_spans(ts[outer], end[outer]), w0, w1) - \
        covered_ns(*union_spans(ts[local], end[local]), w0, w1)
    return got - dispatch, dispatch


def _spread_over_pieces(g, recompute: np.ndarray) -> None:
    """An event's nested recompute, counted once per piece above, split over its pieces by their durations."""
    has = np.flatnonzero(recompute > 0)
    if not len(has):
        return
    key = pd.DataFrame({"rank": g.rank[has], "ev": g.event_id[has], "i": has, "d": g.dur_ns[has]})
    for _, grp in key.groupby(["rank", "ev"]):
        idx = grp.i.to_numpy()
        total = int(recompute[idx[0]])
        d = grp.d.to_numpy(np.float64)
        share = d / d.sum() if d.sum() > 0 else np.full(len(d), 1.0 / len(d))
        recompute[idx] = np.minimum(np.rint(total * share).astype(np.int64), g.dur_ns[idx])


def _token_colls(g, facts: OpFacts, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, measured transfer) of the collectives carrying tokens that rank takes part in: what a block's
    recompute runs again besides its ops (tensor parallelism's; FSDP's all-gathers are not: the backward has
    gathered the parameters)."""
    if not len(g.colls):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    on = facts.coll_act & np.array([rank in set(x) for x in g.colls["present_ranks"]], bool)
    return g.colls.barrier_start_ns.to_numpy(np.int64)[on], g.colls.measured_transfer_ns.to_numpy(np.int64)[on]


def _colls_ns(colls: tuple[np.ndarray, np.ndarray], start: int, end: int) -> int:
    """The measured transfers of colls (_token_colls) that start in [start, end)."""
    at, ns = colls
    return int(ns[(at >= start) & (at < end)].sum())


def _blocks(g, facts: OpFacts) -> None:
    """The forward's repeated blocks per rank (module docstring): block_ns on their nodes, and in facts.blocks the
    period, what recomputing them takes and the backward's time over the rank's whole steps."""
    steps = g.steps
    seqs_of, known_of = {}, {}
    for r in np.unique(g.rank[facts.phase == FORWARD]):
        st = steps[steps["rank"] == r]
        fwd_all = np.flatnonzero((g.rank == r) & (g.kind == _graph.K["cpu"]) & (facts.phase == FORWARD))
        # every step's blocks are marked (the peak may be in the last); the times are the whole steps' only
        seqs = []
        lasts = st.is_last.astype(bool).to_numpy()
        if lasts.all():  # one profiled step (a trace of a single ProfilerStep): it is the whole step there is
            lasts = np.zeros(len(st), bool)
        for s0, s1, last in zip(st.ts_ns.to_numpy(np.int64), st.end_ns.to_numpy(np.int64), lasts):
            idx = fwd_all[(g.start_ns[fwd_all] >= s0) & (g.start_ns[fwd_all] < s1)]
            idx = idx[np.argsort(g.start_ns[idx], kind="stable")]
            _, first = np.unique(g.event_id[idx], return_index=True)  # one entry per event (its first piece)
            seqs.append((s0, s1, last, idx[np.sort(first)]))
        # the period: searched on up to three whole steps (a first profiled step can differ), the one most of them
        # show; the other steps are covered at that period
        tried = [_block_repeat(g, facts, i) for *_, last, i in [x for x in seqs if not x[2]][:3]]
        periods = [t[0] for t in tried if t is not None]
        if periods:
            seqs_of[int(r)] = seqs
            known_of[int(r)] = max(set(periods), key=lambda p: (periods.count(p), -p))
    # one model, one block: a pipeline's last stage, whose micro-batches run its few blocks, the head and the loss,
    # repeats at the micro-batch; a block another rank shows that repeats here too is the block
    smallest = min(known_of.values(), default=0)
    for r, seqs in seqs_of.items():
        colls = _token_colls(g, facts, int(r))
        token_ops = (g.rank == r) & (g.kind == _graph.K["cpu"]) & facts.act
        known = known_of[r]
        if known != smallest:
            whole = [i for *_, last, i in seqs if not last][:1]
            if whole and _block_repeat(g, facts, whole[0], smallest) is not None:
                known = smallest
        for s0, s1, last, idx in seqs:
            found = _block_repeat(g, facts, idx, known)
            if found is None:
                continue
            period, covered = found
            mask = token_ops & np.isin(g.event_id, g.event_id[idx[covered]])
            facts.block_ns[mask] = g.dur_ns[mask]
            if last:
                continue
            # what a recompute runs again: the blocks' ops and the collectives carrying tokens inside them
            ends = g.start_ns[idx] + g.dur_ns[idx]
            d = np.diff(np.concatenate(([0], covered.view(np.int8), [0])))
            wall = int(g.dur_ns[mask & (g.start_ns >= s0) & (g.start_ns < s1)].sum())
            for a, b in zip(np.flatnonzero(d == 1), np.flatnonzero(d == -1)):
                wall += _colls_ns(colls, int(g.start_ns[idx[a]]), int(ends[b - 1]))
            bwd = (g.rank == r) & (facts.phase == BACKWARD) & (g.start_ns >= s0) & (g.start_ns < s1)
            w, b, k = facts.blocks.get(int(r), (period, 0, 0, 0))[1:]
            facts.blocks[int(r)] = (period, w + wall, b + int(g.dur_ns[bwd].sum()), k + 1)


def _block_repeat(g, facts: OpFacts, idx: np.ndarray, period: int | None = None):
    """_repeat over the forward's operators idx (time order) that no other operator holds (OpFacts.nested):
    (period, covered mask over idx), the period counted in those, and a nested operator inside a covered run
    covered with it. The graph shows an operator nested in another as a node of its own where the thread's pieces
    are cut inside its parent (a wait on a collective in flight), so which nested ones are nodes varies from one
    copy of a block to the next: a 1F1B stage's second forward showed the `aten::view` inside a block's last linear,
    its first did not, and the block was not found in it."""
    sub = np.flatnonzero(~facts.nested[idx])
    found = _repeat(facts.op_name[idx[sub]].astype(str), np.where(facts.act[idx[sub]], g.dur_ns[idx[sub]], 0), period)
    if found is None:
        return None
    p, cov_sub = found
    cov = np.zeros(len(idx), bool)
    d = np.diff(np.concatenate(([0], cov_sub.view(np.int8), [0])))
    for a, b in zip(np.flatnonzero(d == 1), np.flatnonzero(d == -1)):
        cov[sub[a]:sub[b - 1] + 1] = True
    return p, cov


def _repeat(seq: np.ndarray, weight: np.ndarray, period: int | None = None):
    """(period, covered mask) of the tandem repeat of seq that covers most of it at the smallest period: for each
    period p, the positions inside runs of seq[i] == seq[i + p] at least p long (two or more whole copies); a repeat
    must hold some weight (ops that follow the tokens), and it is judged by the ops it covers, not their time (a
    few ops that wait on collectives would otherwise outweigh the block). period: only that one (a rank's later
    steps). Periods up to MAX_BLOCK_OPS are tried. A few ops of a copy that differ from the copies beside it (up to
    REPEAT_SLACK_OPS mismatches between matches) do not break the repeat: which of a block's operators the graph
    shows as pieces of their own depends on their timing (one that starts after an idle gap of its thread begins a
    piece; one that follows its sibling without a gap is its parent's time), so a DTensor block's redistribution
    reads `_c10d_functional::all_reduce, _ToTorchTensor` in one copy and `_c10d_functional::_wrap_tensor_autograd,
    aten::view` in the next."""
    n = len(seq)
    best = []
    codes = pd.factorize(seq)[0]
    for p in ([period] if period else range(2, min(n // 2, MAX_BLOCK_OPS) + 1)):
        if p > n // 2:
            continue
        m = codes[:-p] == codes[p:]
        if not m.any():
            continue
        d = np.diff(np.concatenate(([1], m.view(np.int8), [1])))  # runs of mismatches between matches
        for a, b in zip(np.flatnonzero(d == -1), np.flatnonzero(d == 1)):
            if 0 < a and b < len(m) and b - a <= REPEAT_SLACK_OPS:
                m[a:b] = True
        cov = np.zeros(n, bool)
        # runs of True in m of length >= p
        d = np.diff(np.concatenate(([0], m.view(np.int8), [0])))
        starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
        for a, b in zip(starts, ends):
            if b - a >= p:
                cov[a:b + p] = True
        if weight[cov].sum() > 0:
            best.append((p, int(cov.sum()), cov))
    if not best:
        return None
    top = max(c for _, c, _ in best)
    for p, c, cov in best:
        if c >= BLOCK_COVERAGE * top:
            return p, cov
    return None


@dataclass
class MemoryRetime:
    factor: np.ndarray  # per node duration multiplier
    colls_bytes_scale: np.ndarray  # per collective row
    notes: list


def retime(g, run, sc, facts: OpFacts, dur_ns: np.ndarray) -> MemoryRetime:
    """Duration factors for [batch] scale and [memory] (module docstring), applied on top of dur_ns."""
    s = sc.batch.scale
    n = len(dur_ns)
    factor = np.ones(n)
    notes = []
    d = dur_ns.astype(np.float64)
    glue = d * (1.0 - facts.aten_share)  # outside ATen operators: does not follow the tokens
    ckpt = sc.memory.activation_checkpointing
    # checkpointing first, on the run's own times
    if ckpt == "none" and facts.checkpointed:
        py = _recompute_python_ns(g, facts, glue)
        rec = facts.recompute_ns.astype(np.float64) + py
        glue -= py
        has = rec > 0
        factor[has] = np.maximum(d[has] - rec[has], 0) / np.maximum(d[has], 1)
        drop = facts.coll_recompute
        notes.append(f"{sc.where}: activation checkpointing off: the run's recompute ({rec.sum() / 1e6:.1f} ms over "
                     f"the trace, {py.sum() / 1e6:.1f} of them the Python around its ops: what a node that ran one "
                     "takes outside ATen operators beyond its name's others) taken out of the backward nodes that "
                     "ran it" + (f", and the {int(drop.sum())} collective(s) it ran carry nothing"
                                 if drop.any() else ""))
    elif ckpt == "full" and not facts.checkpointed:
        if not facts.blocks:
            from .checks import ScenarioError

            raise ScenarioError(f"{sc.where}: [memory] activation_checkpointing = 'full': the trace's forward shows "
                                "no repeated block (no op sequence that repeats) to checkpoint")
        stops = _early_stops(run, g, facts)
        for r, (_, wall, bwd_ns, _) in facts.blocks.items():
            if r in stops:
                wall = stops[r]
            if bwd_ns > 0:
                factor[(g.rank == r) & (facts.phase == BACKWARD)] *= 1.0 + wall / bwd_ns
        r0 = next(iter(facts.blocks))
        period, wall, _, k = facts.blocks[r0]
        wall = stops.get(r0, wall)
        notes.append(f"{sc.where}: activation checkpointing 'full': the forward repeats a block of {period} ops; the "
                     f"blocks' ops and the collectives carrying tokens in them ({wall / k / 1e6:.1f} ms a step on rank "
                     f"{r0}, as measured) are recomputed in the backward, spread over its nodes by their time"
                     + ("; each recompute stops after the last op whose output the backward keeps (PyTorch's "
                        "checkpoint stops early; the [memory] events show where)" if stops else ""))
    elif ckpt is not None:
        notes.append(f"{sc.where}: [memory] activation_checkpointing = '{ckpt}' is what the run did: no change")
    if s != 1.0:
        if not facts.act.any():
            from .checks import ScenarioError

            raise ScenarioError(f"{sc.where}: [batch] scale: no op of the trace reads a tensor of the step's tokens "
                                "(it records no input shapes: profile with record_shapes=True), so which ops follow "
                                "the batch cannot be told")
        gpu_rank = set(facts.kernel_floor_ns)
        cpu = g.kind == _graph.K["cpu"]
        gpu = g.kind == _graph.K["gpu"]
        scale = facts.act & (facts.phase != OPTIMIZER)
        on_gpu = np.isin(g.rank, list(gpu_rank)) if gpu_rank else np.zeros(n, bool)
        fl = np.zeros(n)
        sel_cpu = scale & cpu & ~on_gpu
        for r, f in facts.floor_ns.items():
            m = sel_cpu & (g.rank == r)
            fl[m] = f * facts.n_ops[m]
        # a node's time outside ATen operators (the autograd engine's, a checkpoint's hooks') is fixed too
        fl[sel_cpu] += glue[sel_cpu]
        sel_gpu = scale & gpu
        for r, f in facts.kernel_floor_ns.items():
            m = sel_gpu & (g.rank == r)
            fl[m] = f
        sel = sel_cpu | sel_gpu
        cur = d * factor
        base = np.minimum(fl, cur)
        new = base + (cur - base) * s
        factor[sel] = np.where(cur[sel] > 0, new[sel] / np.maximum(cur[sel], 1e-9), 1.0) * factor[sel]
        notes.append(f"{sc.where}: global batch x{s:g}: {int(sel.sum())} ops that read the step's tokens re-timed as "
                     f"floor + (time - floor) x {s:g} (floor: the run's own per-op time of ops that move no data), "
                     f"{int(facts.coll_act.sum())} collective(s) carrying tokens (tensor or pipeline parallel) "
                     f"x{s:g} bytes; gradient and parameter collectives and the optimizer unchanged")
    coll_scale = np.where(facts.coll_act, s, 1.0)
    if ckpt == "none" and facts.checkpointed:
        coll_scale[facts.coll_recompute] = 0.0
    return MemoryRetime(factor, coll_scale, notes)


def _recompute_python_ns(g, facts: OpFacts, glue: np.ndarray) -> np.ndarray:
    """Per node, the Python of the checkpoint recompute it ran besides the recompute's ATen operators (restoring
    the forward's state, running the block's module code): the node's time outside ATen operators (glue, ns per
    node) beyond the median of the rank's nodes of its name that ran no recompute (an AddmmBackward0 that recomputed
    its block: ~500 us outside its operators, the block's other AddmmBackward0s ~20). Split over an event's pieces
    as its glue is."""
    out = np.zeros(len(glue))
    has = facts.recompute_ns > 0
    if not has.any():
        return out
    bwd = (facts.phase == BACKWARD) & (g.kind == _graph.K["cpu"])
    df = pd.DataFrame({"rank": g.rank[bwd], "ev": g.event_id[bwd], "name": g.name[bwd], "glue": glue[bwd],
                       "rec": has[bwd], "i": np.flatnonzero(bwd)})
    per_ev = df.groupby(["rank", "ev"], sort=False).agg(name=("name", "first"), glue=("glue", "sum"),
                                                        rec=("rec", "any"))
    ref = per_ev[~per_ev.rec].groupby(["rank", "name"]).glue.median()
    ran = per_ev[per_ev.rec]
    excess = np.maximum(ran.glue.to_numpy() - ref.reindex(pd.MultiIndex.from_arrays(
        [ran.index.get_level_values(0), ran.name])).to_numpy(dtype=np.float64, na_value=np.inf), 0)
    excess = pd.Series(excess, index=ran.index)
    pieces = df[df.rec]
    total = pieces.groupby(["rank", "ev"]).glue.transform("sum").to_numpy()
    share = np.where(total > 0, pieces.glue.to_numpy() / np.maximum(total, 1e-9), 0.0)
    out[pieces.i.to_numpy()] = excess.reindex(pd.MultiIndex.from_frame(pieces[["rank", "ev"]])).to_numpy() * share
    return out


def _early_stops(run, g, facts: OpFacts) -> dict:
    """rank -> what recomputing its blocks takes over its whole steps, where the [memory] events show what each
    block keeps for the backward: PyTorch's non-reentrant checkpoint stops a recompute once every tensor the
    backward saved is made again, so a block's recompute runs its ops up to the last one whose allocation the
    backward keeps (its output, the next block's input, aside), and the token collectives before it. {} without
    [memory] events (the whole block is recomputed)."""
    if not has_memory_events(run):
        return {}
    blocks = _memory_analysis(run, facts.analyses, "memory_blocks")
    blocks = blocks[blocks.category == "activations"]
    out = {}
    for r in facts.blocks:
        mine = blocks[blocks["rank"] == r]
        ts = mine.alloc_ts_ns.to_numpy(np.int64)
        ends = mine.end_ts_ns.to_numpy(dtype="float64", na_value=np.inf)
        bwd = np.sort(g.start_ns[(g.rank == r) & (facts.phase == BACKWARD)])
        on_r = (g.rank == r) & (facts.block_ns > 0)
        others = _interruptions(g, facts, int(r))
        colls = _token_colls(g, facts, int(r))
        st = g.steps[(g.steps["rank"] == r) & ~g.steps["is_last"].astype(bool)]
        total = 0
        for s0, s1 in zip(st.ts_ns.to_numpy(np.int64), st.end_ns.to_numpy(np.int64)):
            for a, b in _runs(g, np.flatnonzero(on_r & (g.start_ns >= s0) & (g.start_ns < s1)), facts, others):
                i = np.searchsorted(bwd, b)
                kept = np.sort(ts[(ts >= a) & (ts < b) & (ends > (bwd[i] if i < len(bwd) else np.inf))])
                cut = int(kept[-2]) + 1 if len(kept) >= 2 else b  # the last kept but the block's output
                upto = on_r & (g.start_ns >= a) & (g.start_ns < cut)
                total += int(g.dur_ns[upto].sum()) + _colls_ns(colls, a, cut)
        out[int(r)] = total
    return out


def _memory_analysis(run, cache: dict, name: str) -> pd.DataFrame:
    """The memory analysis `name` of the run (or "memory_series": every rank's allocator totals in order, the
    memory_timeline analysis's), read once for everything that shares cache (one what-if's facts.analyses, doctor's
    headroom search)."""
    import analyses.memory as _memory

    if name not in cache:
        cache[name] = (_memory.memory_timeline(run).rename(columns={"allocated_bytes": "total_allocated"})
                       if name == "memory_series" else getattr(_memory, name)(run))
    return cache[name]


def has_memory_events(run) -> bool:
    """Whether the store holds any [memory] event."""
    return bool(run.sql("SELECT count(*) > 0 AS has FROM (SELECT 1 FROM memory LIMIT 1)").has.iloc[0])


# ---- the optimizer's state offloaded to the host ----------------------------------------------------------
def offload(run, g, facts: OpFacts, sc) -> tuple[np.ndarray, dict, list]:
    """[memory] offload_optimizer: ns added per node (the state in over the host link before the optimizer's first
    kernel of each step, out after its last), the state's bytes per rank, and notes. The state is what the device
    holds of it at the peak (memory_breakdown's optimizer_state); the link is [memory] host_link_gbps, else the
    device catalog's for the rank's GPU ([hardware] gpu's when given)."""
    from analyses.devices import catalog, device_properties, match

    from .checks import ScenarioError

    gpu = g.kind == _graph.K["gpu"]
    if not gpu.any():
        raise ScenarioError(f"{sc.where}: [memory] offload_optimizer: the run has no GPU ops (a CPU run): its "
                            "optimizer state is in host memory already")
    br = _memory_analysis(run, facts.analyses, "memory_breakdown")
    if not len(br):
        raise ScenarioError(f"{sc.where}: [memory] offload_optimizer: the trace has no [memory] events to find the "
                            "optimizer state in (profile with profile_memory=True)")
    opt = br[br.category == "optimizer_state"].groupby("rank").bytes_at_peak.max()
    devs = catalog(sc.hardware.catalog)
    named = match(sc.hardware.gpu, devs) if sc.hardware.gpu else None
    props = device_properties(run)
    added = np.zeros(len(g.kind), np.int64)
    state, notes, links = {}, [], set()
    for r in np.unique(g.rank[gpu]):
        r = int(r)
        state[r] = int(opt.get(r, 0))
        gbps = sc.memory.host_link_gbps
        if gbps is None:
            dev = named or next((d for p in props.get(r, []) for d in [match(p.get("name"), devs)] if d), None)
            gbps = dev.host_link_gbps if dev is not None else None
            if gbps is None:
                raise ScenarioError(f"{sc.where}: [memory] offload_optimizer: the host link of rank {r}'s GPU "
                                    f"({dev.name if dev else 'not in the device catalog'}) is unknown: give "
                                    "[memory] host_link_gbps")
        links.add(gbps)
        one_way = int(round(state[r] / (gbps * 1e9) * 1e9))
        on = gpu & (g.rank == r) & (facts.phase == OPTIMIZER)
        for s0, s1 in zip(g.steps[g.steps["rank"] == r].ts_ns, g.steps[g.steps["rank"] == r].end_ns):
            idx = np.flatnonzero(on & (g.start_ns >= s0) & (g.start_ns < s1))
            if len(idx):
                idx = idx[np.argsort(g.start_ns[idx], kind="stable")]
                added[idx[0]] += one_way
                added[idx[-1]] += one_way
    if not any(state.values()):
        notes.append(f"{sc.where}: [memory] offload_optimizer: no optimizer state found in device memory at the peak "
                     "(memory_breakdown: it needs the optimizer's shapes, record_shapes=True): nothing moves")
    else:
        mb = max(state.values()) / 1e6
        notes.append(f"{sc.where}: optimizer state offloaded: {mb:.1f} MB a rank in and out over a "
                     f"{'/'.join(f'{x:g}' for x in sorted(links))} GB/s host link each step (before the optimizer's "
                     "first kernel and after its last, nothing overlapping them), and off the device's peak")
    return added, state, notes


# ---- the peak ------------------------------------------------------------------------------------------
PEAK_COLUMNS = ["rank", "device_type", "device_id", "measured_peak_alloc_bytes", "predicted_peak_alloc_bytes"]


def peak_devices(run, cache: dict) -> pd.DataFrame:
    """memory_peak's row for each rank's device that can run out (analyses.memory.memory_limiting_devices; the
    largest peak of them), by rank: what a predicted peak is judged on. Empty without [memory] events."""
    from analyses.memory import memory_limiting_devices

    mp = _memory_analysis(run, cache, "memory_peak")
    if not len(mp):
        return mp
    return (memory_limiting_devices(mp).sort_values("peak_allocated_bytes", kind="stable").groupby("rank").tail(1)
            .sort_values("rank"))


def predict_peak(run, g, facts: OpFacts | None, sc, cache: dict | None = None) -> pd.DataFrame:
    """Per rank, on the device it can run out of (analyses.memory.memory_limiting_devices; the largest peak of them):
    measured_peak_alloc_bytes and
    predicted_peak_alloc_bytes. Empty when the trace has no [memory] events.

    The allocator's measured series, every block of it changed as the scenario says (memory_blocks: each block's
    lifetime and category), and the new series' largest value:
    - [batch] scale s: activations and other (temporaries) take s x their bytes, communication buffers too where
      made in a collective call whose tensors carry tokens (_follows_tokens); parameters, gradients and optimizer
      state keep theirs;
    - checkpointing 'full' on a run without it: what each forward block allocates and keeps for the backward,
      but its output, is freed at the block's end and allocated again where the backward first frees any of it
      (the recompute just before its backward);
    - 'none' on a checkpointed run: what each recompute allocates and keeps is allocated in the forward instead,
      at the start of its block (the block whose op's backward node ran the recompute; where that is not known,
      the recomputes in the backward's order are the forward's blocks reversed).
    The series keeps the measured times: the step's re-timing does not move the allocations. cache: where the memory
    analyses it reads are kept between calls (default: facts', else read afresh)."""
    cache = cache if cache is not None else (facts.analyses if facts is not None else {})
    top = peak_devices(run, cache)
    if not len(top):
        return pd.DataFrame(columns=PEAK_COLUMNS)
    s = sc.batch.scale
    ckpt = sc.memory.activation_checkpointing
    moves = ckpt is not None and facts is not None and (ckpt == "none") == facts.checkpointed
    off = sc.memory.offload_optimizer
    changes = s != 1.0 or moves or off
    blocks = _memory_analysis(run, cache, "memory_blocks") if changes else None
    series = _memory_analysis(run, cache, "memory_series") if changes else None
    opt_at_peak = {}
    if off:
        br = _memory_analysis(run, cache, "memory_breakdown")
        br = br[br.category == "optimizer_state"]
        opt_at_peak = {(int(a), int(b), int(c)): float(v) for a, b, c, v in
                       br[["rank", "device_type", "device_id", "bytes_at_peak"]].itertuples(index=False)}
    rows = []
    for r, dt, di, meas, peak_ts in top[["rank", "device_type", "device_id", "peak_allocated_bytes",
                                         "peak_allocated_ts_ns"]].itertuples(index=False):
        pred = float(meas)
        if changes:
            ev = series[(series["rank"] == r) & (series.device_type == dt) & (series.device_id == di)]
            mine = blocks[(blocks["rank"] == r) & (blocks.device_type == dt) & (blocks.device_id == di)]
            deltas = _scaled(mine, s, facts) if s != 1.0 else []
            if moves:  # a moved block has its new size (the batch's) where it moves
                grow = np.where(_follows_tokens(mine, facts), s, 1.0)
                mine = mine.assign(bytes=mine.bytes.to_numpy(np.float64) * grow)
                deltas += (_recomputed(g, facts, int(r), mine) if ckpt == "full"
                           else _kept(g, facts, int(r), mine))
            pre_opt = 0.0
            if off:  # the state's blocks leave the device, and the share of it allocated before profiling
                state = mine[mine.category == "optimizer_state"]
                deltas += [(a, e, -float(b.bytes)) for b in state.itertuples(index=False) for a, e in [_life(b)]]
                live = state[(state.alloc_ts_ns <= peak_ts) & (state.end_ts_ns.isna() | (state.end_ts_ns > peak_ts))]
                pre_opt = max(opt_at_peak.get((int(r), int(dt), int(di)), 0.0) - float(live.bytes.sum()), 0.0)
            pred = _peak(ev.ts_ns.to_numpy(np.int64), ev.total_allocated.to_numpy(np.float64), deltas) - pre_opt
        rows.append({"rank": int(r), "device_type": int(dt), "device_id": int(di),
                     "measured_peak_alloc_bytes": int(meas), "predicted_peak_alloc_bytes": int(round(pred))})
    return pd.DataFrame(rows)


_END = np.iinfo(np.int64).max


def _life(b) -> tuple[int, int]:
    return int(b.alloc_ts_ns), (_END if pd.isna(b.end_ts_ns) else int(b.end_ts_ns))


def _follows_tokens(blocks: pd.DataFrame, facts: OpFacts | None) -> np.ndarray:
    """Which blocks follow the tokens a rank holds: activations and other (the temporaries), and the communication
    buffers made inside a collective call whose tensors carry the tokens (OpFacts.token_calls: a pipeline's sends, a
    tensor-parallel all-reduce; not a data-parallel gradient reduction's, whose bytes are the parameters')."""
    out = np.array(blocks.category.isin(("activations", "other")), dtype=bool)
    comm = np.flatnonzero((blocks.category == "communication_buffers").to_numpy(bool))
    calls = facts.token_calls if facts is not None else None
    if not len(comm) or calls is None or not len(calls):
        return out
    b = blocks.iloc[comm]
    for (r, tid), c in calls.groupby(["rank", "tid"], sort=False):
        c = c.sort_values("start")
        starts, reach = c.start.to_numpy(np.int64), np.maximum.accumulate(c.end.to_numpy(np.int64))
        m = np.flatnonzero((b["rank"].to_numpy() == r) & (b.tid.to_numpy() == tid))
        t = b.alloc_ts_ns.to_numpy(np.int64)[m]
        k = np.searchsorted(starts, t, side="right") - 1
        out[comm[m]] |= (k >= 0) & (reach[np.maximum(k, 0)] >= t)
    return out


def _scaled(blocks: pd.DataFrame, s: float, facts: OpFacts | None) -> list:
    """(from, to, bytes) changes of the blocks that follow the tokens (_follows_tokens), at s x their size."""
    out = []
    for b in blocks[_follows_tokens(blocks, facts)].itertuples(index=False):
        a, e = _life(b)
        out.append((a, e, (s - 1.0) * b.bytes))
    return out


def _forward_blocks(g, facts: OpFacts, rank: int) -> list[list[tuple[int, int]]]:
    """Per step of the rank, the (start, end) of each forward block, in time order."""
    out = []
    st = g.steps[g.steps["rank"] == rank]
    others = _interruptions(g, facts, rank)
    for s0, s1 in zip(st.ts_ns.to_numpy(np.int64), st.end_ns.to_numpy(np.int64)):
        on = np.flatnonzero((g.rank == rank) & (facts.block_ns > 0) & (g.start_ns >= s0) & (g.start_ns < s1))
        out.append(_runs(g, on[np.argsort(g.start_ns[on], kind="stable")], facts, others))
    return out


def _backward_starts(g, facts: OpFacts, rank: int) -> np.ndarray:
    """The start times, sorted, of the rank's backward nodes."""
    return np.sort(g.start_ns[(g.rank == rank) & (facts.phase == BACKWARD)])


def _recomputed(g, facts: OpFacts, rank: int, blocks: pd.DataFrame) -> list:
    """Checkpointing a run that did not: each forward block's kept allocations (its output aside) are not held
    from the block's end until its backward starts (the first of them freed)."""
    out = []
    act = blocks[blocks.category == "activations"]
    ts = act.alloc_ts_ns.to_numpy(np.int64)
    ends = act.end_ts_ns.to_numpy(dtype="float64", na_value=np.inf)
    bwd = _backward_starts(g, facts, rank)
    for spans in _forward_blocks(g, facts, rank):
        for a, b in spans:
            i = np.searchsorted(bwd, b)
            if i == len(bwd):
                continue
            # kept for the backward: still live when the backward after the block begins
            kept = np.flatnonzero((ts >= a) & (ts < b) & (ends > bwd[i]))
            if len(kept) < 2:
                continue
            kept = kept[np.argsort(ts[kept], kind="stable")][:-1]  # the last: the block's output, the next's input
            back = ends[kept].min()
            if not np.isfinite(back) or back <= b:
                continue
            out += [(b, int(back), -float(x)) for x in act.bytes.to_numpy()[kept]]
    return out


def _kept(g, facts: OpFacts, rank: int, blocks: pd.DataFrame) -> list:
    """A checkpointed run without checkpointing: what each recompute allocates and keeps is held from the start of
    its forward block on (the block holding the forward op of the backward node the recompute ran in: a 1F1B
    stage runs a micro-batch's backward between later ones' forwards). What it keeps: what it allocates up to the
    end of its forward and is still live there. A recompute's span ends at its last operator with an autograd
    sequence number, and a tensor subclass's operators (DTensor's redistributions, a tensor-parallel block's
    collectives and the operators after them) have none: its forward ends at the last activation (memory_blocks'
    category: the forward's operators under a backward node) allocated after the span and before the backward's
    next node, the next recompute or forward block starts."""
    out = []
    ts = blocks.alloc_ts_ns.to_numpy(np.int64)
    ends = blocks.end_ts_ns.to_numpy(dtype="float64", na_value=np.inf)
    act = (blocks.category == "activations").to_numpy(bool)
    rec = facts.recompute_spans
    rec = rec[rec["rank"] == rank]
    st = g.steps[g.steps["rank"] == rank]
    fwd = _forward_blocks(g, facts, rank)
    bwd = _backward_starts(g, facts, rank)
    for (s0, s1), spans in zip(zip(st.ts_ns.to_numpy(np.int64), st.end_ns.to_numpy(np.int64)), fwd):
        mine = rec[(rec.start >= s0) & (rec.start < s1)].sort_values("start")
        if not len(mine) or not spans:
            continue
        starts = mine.start.to_numpy(np.int64)
        upto = np.append(starts[1:], s1)
        block_starts = np.array([x for x, _ in spans], np.int64)
        block_ends = np.array([y for _, y in spans], np.int64)
        # nor past the next forward block (a 1F1B stage's next micro-batch's forward comes between recomputes)
        nxt = np.searchsorted(block_starts, mine.end.to_numpy(np.int64), side="left")
        upto = np.minimum(upto, np.where(nxt < len(spans), block_starts[np.minimum(nxt, len(spans) - 1)], s1))
        for j, (a, b, f) in enumerate(zip(starts, mine.end.to_numpy(np.int64), mine.fwd_ts.to_numpy(np.int64))):
            # the block whose op's backward node ran the recompute (a 1F1B stage interleaves its micro-batches'
            # forwards and backwards); else by order: the backward recomputes the last block first
            k = np.searchsorted(block_starts, f, side="right") - 1 if f >= 0 else -1
            if k < 0 or f >= block_ends[k]:
                k = len(spans) - 1 - j
            start = spans[max(k, 0)][0]
            # the recompute's forward goes on to its last activation after the span and before the backward's
            # next node (a DTensor block's redistribution and the operators after it); kept: what it allocates up
            # to there, whatever the category (a residual add after the all-reduce is arithmetic, which a backward
            # node runs too: other), that is still live there. What it frees before (a row-parallel linear's
            # partial output, the all-reduce's buffer) is its temporaries, which the forward without
            # checkpointing frees too
            i = np.searchsorted(bwd, b, side="left")
            after = (ts >= b) & (ts < (min(int(upto[j]), int(bwd[i])) if i < len(bwd) else upto[j])) & act
            on = max(int(b), int(ts[after].max())) if after.any() else int(b)
            held = np.flatnonzero((ts >= a) & (ts <= on) & (ends > on))
            out += [(start, int(t), float(x)) for t, x in zip(ts[held], blocks.bytes.to_numpy()[held])]
    return out


def _peak(ts: np.ndarray, total: np.ndarray, deltas: list) -> float:
    """The largest value of the measured series (total after each event at ts) plus the changes (from, to, bytes)."""
    if not len(ts):
        return 0.0
    if not deltas:
        return float(total.max())
    d = np.asarray(deltas, dtype=np.float64)
    pts = np.concatenate([d[:, 0], d[:, 1]])
    vals = np.concatenate([d[:, 2], -d[:, 2]])
    order = np.argsort(pts, kind="stable")
    pts, cum = pts[order], np.cumsum(vals[order])
    at = np.unique(np.concatenate([ts.astype(np.float64), pts[np.isfinite(pts) & (pts < _END)]]))
    base = total[np.clip(np.searchsorted(ts, at, side="right") - 1, 0, None)]
    base[at < ts[0]] = 0.0
    i = np.searchsorted(pts, at, side="right") - 1
    change = np.where(i >= 0, cum[np.clip(i, 0, None)], 0.0)
    return float(max((base + change).max(), 0.0))


def _interruptions(g, facts: OpFacts, rank: int) -> np.ndarray:
    """The start times, sorted, of the rank's forward operators outside every block: what ends a stretch of blocks
    (_runs)."""
    return np.sort(g.start_ns[(g.rank == rank) & (g.kind == _graph.K["cpu"]) & (facts.phase == FORWARD)
                              & (facts.block_ns <= 0)])


def _runs(g, on: np.ndarray, facts: OpFacts, others: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each block in the forward: its period's consecutive block nodes (first pieces), counted within
    each stretch of block nodes that no other forward operator (others: _interruptions) interrupts (a pipeline's last
    stage runs its head, loss and receive between micro-batches: a block does not run across them); a stretch's tail
    shorter than a period less REPEAT_SLACK_OPS is no block."""
    if not len(on):
        return []
    _, first = np.unique(g.event_id[on], return_index=True)
    on = on[np.sort(first)]
    period = facts.blocks[int(g.rank[on[0]])][0]
    starts = g.start_ns[on]
    cut = np.searchsorted(others, starts[1:], side="left") > np.searchsorted(others, starts[:-1], side="right")
    out = []
    for part in np.split(on, np.flatnonzero(cut) + 1):
        part = part[~facts.nested[part]]  # the period counts operators no other holds (_block_repeat)
        for i in range(0, len(part), period):
            p = part[i:i + period]
            if len(p) >= max(period - REPEAT_SLACK_OPS, 1):
                out.append((int(g.start_ns[p[0]]), int(g.start_ns[p[-1]] + g.dur_ns[p[-1]])))
    return out
