"""The model's structure and per-step work as a trace shows it, without annotations: what a re-layout
(replay/relayout.py) re-times and re-sizes.

From the dependency graph and op_facts (replay/memory.py), per rank and profiled step (the last one left out):
- the forward's repeated blocks (op_facts' tandem repeat of the forward's op sequence: Lumos' layer grouping, found
  without `layer.<i>` annotations), how many a micro-batch runs, and the ops before the first block (embedding:
  `pre`) and after the last (head and loss: `post`);
- each backward node's forward op, by autograd's sequence number (a backward node carries the number of the forward
  op that recorded it), so the backward is split into the same blocks, `pre` and `post`;
- inside a block, which ops a tensor-parallel split divides: a linear that reads a norm's output (the block's
  hidden) is column-parallel, the ops after it up to the next linear that follows an attention or activation
  (the row-parallel one, itself included) are split; norms and residual adds are not (Megatron's and DTensor's
  `ColwiseParallel` / `RowwiseParallel` plan). A column-parallel linear's input gradient and a row-parallel
  linear's output are all-reduced: one collective each, per block and micro-batch;
- the per-op floor (op_facts: the run's own time of ops that move no data, times the ops in a node), the node's
  time outside ATen operators (autograd's engine, hooks: op_facts' aten_share) and the thread's gap before it
  (Python, the framework): what a node takes whatever its size; the rest of its time follows its tokens (and its
  share of a split);
- tensor-parallel glue (DTensor's Redistribute, wrappers) and collective calls: CPU time per collective;
- FSDP's own work: the ops inside its `FSDP::` record_function ranges (copies into and out of the flat buffers,
  its hooks), which only a sharded layout spends;
- a tensor subclass's dispatch (op_facts' dispatch_ns: DTensor's aten::addmm -> PythonSubclass -> aten::addmm on
  the local shard; the subclass's operators' and PythonSubclass's time outside the operators it runs), which only
  a layout with the subclass spends;
- on a GPU rank, an op's work is the compute kernels it launched (the step follows the device);
- the optimizer: its ops' floors (a set per parameter tensor) and the rest, which follows the bytes a rank holds;
  the rest of the step (data loading, hooks: kept);
- shapes: tokens and hidden size of a micro-batch at a block boundary (what a pipeline stage sends and a
  tensor-parallel all-reduce carries), element bytes, the bytes each rank's optimizer updates (analyses
  parameter_bytes) and the gradients AccumulateGrad receives (a DTensor's global shape: the model's parameters), a
  block's weights (its linears' and norms').
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analyses import depgraph as _graph
from analyses.intervals import union_spans

from .memory import BACKWARD, BACKWARD_PREFIX, COLL_CALL_PREFIXES, FORWARD, OPTIMIZER, OpFacts

NORMS = ("aten::layer_norm", "aten::native_layer_norm", "aten::rms_norm", "aten::_fused_rms_norm", "aten::group_norm",
         "FusedLayerNormAffineFunction", "MixedFusedLayerNorm", "FusedRMSNormAffineFunction")  # Megatron's last
# Megatron's column- and row-parallel linears run as LinearWithGradAccumulationAndAsyncCommunication
LINEARS = ("aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "LinearWithGradAccumulationAndAsyncCommunication")
# what mixes a column-parallel split before its row-parallel linear: attention, activations
MIXERS = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
          "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
          "aten::softmax", "aten::_softmax", "aten::gelu", "aten::silu", "aten::relu", "aten::bmm", "aten::baddbmm",
          "ScaledUpperTriangMaskedSoftmax", "ScaledMaskedSoftmax", "FusedScaleMaskSoftmax", "GeLUFunction")
# tensor parallelism's glue: DTensor's wrappers and redistributions, forward and backward
TP_GLUE = ("Redistribute", "_FromTorchTensor", "_ToTorchTensor", "RedistributeBackward", "_ToTorchTensorBackward",
           "_FromTorchTensorBackward")
ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1,
                 "c10::Float8_e5m2": 1, "long int": 8, "int": 4}

# node categories
PRE, BLOCK, POST = 0, 1, 2
WHERE = ("pre", "block", "post")


@dataclass
class RankWork:
    """One rank's work per step (medians over its profiled steps but the last), ns."""
    rank: int
    blocks: int  # blocks a micro-batch of this rank runs (its stage's)
    # [phase (0 forward, 1 backward)][where (pre, block, post)][split (0 kept, 1 divided by tp)] -> (floor, rest)
    work: np.ndarray = field(default_factory=lambda: np.zeros((2, 3, 2, 2)))
    optimizer_ns: float = 0.0  # its work beyond the floor (what follows the bytes it updates)
    optimizer_floor_ns: float = 0.0  # its ops' floors and the thread's gaps between them (one set per tensor)
    params_ns: float = 0.0  # parameter-sized work outside the optimizer (gradient accumulation, hooks)
    other_ns: float = 0.0  # the rest of the step (data loading, ...): kept
    # a tensor subclass's dispatch (DTensor's): per [phase][where] and in the optimizer, ns a step (module docstring)
    wrapper: np.ndarray = field(default_factory=lambda: np.zeros((2, 3)))
    optimizer_wrapper_ns: float = 0.0
    tp_glue_ns: float = 0.0  # DTensor glue
    sharding_ns: float = 0.0  # FSDP's own work (its copies in and out, its hooks: what its FSDP:: ranges hold)
    coll_call_ns: float = 0.0  # CPU time in collective calls
    n_colls: float = 0.0  # collectives a step calls on this rank


@dataclass
class Structure:
    """What a re-layout needs from the source run (module docstring)."""
    ranks: dict  # rank -> RankWork
    period_ops: int  # ops in one block
    colwise: int  # column-parallel linears per block
    rowwise: int  # row-parallel linears per block
    tokens: int  # tokens of a rank's micro-batch at a block boundary
    hidden: int  # the hidden size at a block boundary
    element_bytes: int
    split_dims: set  # what a tensor-parallel split cuts: the blocks' linear widths (global shapes)
    heads: int  # attention heads a rank computes (its query's second dimension; 0: no attention op seen)
    block_param_bytes: float  # a block's parameters (its linears' and norms' weights and biases, global shapes), bytes
    param_bytes: dict  # rank -> the parameters its optimizer updates, bytes
    grad_bytes: dict  # rank -> the gradients a micro-batch's backward hands AccumulateGrad (global shapes), bytes
    steps: int
    notes: list = field(default_factory=list)
    largest_grad_bytes: dict = field(default_factory=dict)  # rank -> the largest one gradient AccumulateGrad receives


_OPS_SQL = """
SELECT rank, tid, event_id, name, ts_ns, ts_ns + dur_ns AS end_ns, coalesce(sequence_number, -1) AS seq,
       input_dims, input_types
FROM events WHERE ph = 'X' AND cat IN ('cpu_op', 'user_annotation') AND dur_ns IS NOT NULL
"""


def structure(run, g, facts: OpFacts, micro_batches: int = 1, where: str = "") -> Structure:
    """The source run's structure and work (module docstring); micro_batches: what the run's step holds; where: the
    scenario, for the one-line refusal."""
    from .checks import ScenarioError

    if not facts.blocks:
        raise ScenarioError(f"{where + ': ' if where else ''}[parallelism]: the trace's forward shows no repeated block "
                            "(no op sequence that repeats, or no input shapes: profile with record_shapes=True), so "
                            "there are no layers to split")
    ev = run.sql(_OPS_SQL)
    cpu = g.kind == _graph.K["cpu"]
    is_last = g.steps["is_last"].astype(bool)
    # the profiled steps but the last (cut short by the profiler's stop); a rank's only step is whole
    steps = g.steps[~is_last | ~(~is_last).groupby(g.steps["rank"]).transform("any")]
    in_step = np.zeros(len(g.kind), bool)
    step_of = np.full(len(g.kind), -1, np.int64)
    for r, s, s0, s1 in zip(steps["rank"], steps["step"], steps.ts_ns, steps.end_ns):
        m = (g.rank == r) & (g.start_ns >= s0) & (g.start_ns < s1)
        in_step |= m
        step_of[m] = s
    where = np.full(len(g.kind), -1, np.int8)
    split = np.zeros(len(g.kind), bool)
    names = g.name.astype(str)
    fwd = cpu & in_step & (facts.phase == FORWARD)
    colwise = rowwise = 0
    tokens = hidden = elem = 0
    # the forward: blocks, pre and post, and the tensor-parallel split inside the blocks
    seq_where: dict = {}
    blocks_of = {}
    block_params = 0.0
    split_dims, heads = set(), 0
    for r in np.unique(g.rank[fwd]):
        mine = np.flatnonzero(fwd & (g.rank == r))
        mine = mine[np.argsort(g.start_ns[mine], kind="stable")]
        for s in np.unique(step_of[mine]):
            idx = mine[step_of[mine] == s]
            b = facts.block_ns[idx] > 0
            if not b.any():
                where[idx] = PRE
                continue
            first, last = np.flatnonzero(b)[[0, -1]]
            where[idx[:first]] = PRE
            where[idx[last + 1:]] = POST
            where[idx[first:last + 1]] = np.where(b[first:last + 1], BLOCK, PRE)
        # one entry per event (an event cut into pieces around its waits is one op)
        blk = mine[facts.block_ns[mine] > 0]
        _, first_piece = np.unique(g.event_id[blk], return_index=True)
        ops = blk[np.sort(first_piece)]
        cw, rw, sp = _split(names[ops])
        split[np.isin(g.event_id, g.event_id[ops[sp]]) & (g.rank == r)] = True
        # the period counts the operators no other holds (memory._block_repeat)
        n_blocks = int((~facts.nested[ops]).sum()) / max(_period(facts, r), 1)
        blocks_of[int(r)] = n_blocks
        if n_blocks >= 1 and not block_params:
            block_params = _weights(ev, int(r), g.event_id[ops], names[ops]) / n_blocks
            split_dims, heads = _split_dims(ev, int(r), g.event_id[ops[sp]], names[ops[sp]])
        if n_blocks >= 1 and not (colwise or rowwise):
            colwise, rowwise = int(round(cw / n_blocks)), int(round(rw / n_blocks))
    # shapes at a block boundary: the first norm's input inside a block (else the block's first op reading a tensor
    # of two or more dimensions)
    e = ev.drop_duplicates(["rank", "event_id"]).set_index(["rank", "event_id"])
    blk_nodes = np.flatnonzero(fwd & (where == BLOCK))
    blk_nodes = blk_nodes[np.lexsort((g.start_ns[blk_nodes], g.rank[blk_nodes]))]
    for want_norm in (True, False):
        for i in blk_nodes:
            if want_norm and names[i] not in NORMS:
                continue
            row = e.loc[(int(g.rank[i]), int(g.event_id[i]))]
            if not isinstance(row.input_dims, str):
                continue
            dims = json.loads(row.input_dims)
            if not dims or not isinstance(dims[0], list) or len(dims[0]) < 2 or isinstance(dims[0][0], list):
                continue
            types = json.loads(row.input_types) if isinstance(row.input_types, str) else ["float"]
            tokens, hidden = int(np.prod(dims[0][:-1])), int(dims[0][-1])
            elem = ELEMENT_BYTES.get(types[0] if types else "float", 4)
            break
        if tokens:
            break
    # the backward: each node's forward op by sequence number (the forward node holding the op with that number)
    for (r, tid), x in ev[ev.seq >= 0].groupby(["rank", "tid"], sort=False):
        nodes = np.flatnonzero(fwd & (g.rank == r))
        if not len(nodes):
            continue
        nodes = nodes[np.argsort(g.start_ns[nodes], kind="stable")]
        ts = x.ts_ns.to_numpy(np.int64)
        at = np.searchsorted(g.start_ns[nodes], ts, side="right") - 1
        ok = at >= 0
        ok[ok] &= ts[ok] < (g.start_ns[nodes] + g.dur_ns[nodes])[at[ok]]
        for sq, node in zip(x.seq.to_numpy(np.int64)[ok], nodes[at[ok]]):
            seq_where[(int(r), int(sq))] = (int(where[node]), bool(split[node]))
    bwd = cpu & in_step & (facts.phase == BACKWARD)
    key = e.seq
    bidx = np.flatnonzero(bwd)
    bseq = key.reindex(pd.MultiIndex.from_arrays([g.rank[bidx], g.event_id[bidx]])).to_numpy()
    unmapped = np.zeros(len(g.kind), bool)
    for i, sq in zip(bidx, bseq):
        got = seq_where.get((int(g.rank[i]), int(sq))) if sq is not None and sq >= 0 else None
        if got is not None and got[0] >= 0:
            where[i], split[i] = got[0], got[1]
        else:
            unmapped[i] = True
    bare = pd.Series(names).str.removeprefix(BACKWARD_PREFIX + " ")
    glue = cpu & in_step & bare.isin(TP_GLUE).to_numpy()
    call = cpu & in_step & bare.str.startswith(COLL_CALL_PREFIXES).to_numpy()
    sharding, in_fsdp = _inside(g, run, "FSDP::")
    sharding &= cpu & in_step
    aside = glue | call | sharding
    floor = np.zeros(len(g.kind))
    for r, f in facts.floor_ns.items():
        m = g.rank == r
        floor[m] = f * facts.n_ops[m]
    dur = g.dur_ns.astype(np.float64)
    # a node's time outside ATen operators (autograd's engine, hooks, Python: op_facts' aten_share) is floor too,
    # but for a tensor subclass's dispatch (wrap, op_facts' dispatch_ns: spent only by a layout that has the subclass,
    # DTensor's: tensor parallelism's activations, the optimizer on FSDP2's or TP's parameters)
    aten_ns = dur * facts.aten_share
    wrap = np.where(cpu, facts.dispatch_ns, 0.0)
    floor = np.minimum(floor, aten_ns) + np.maximum(dur - aten_ns - wrap, 0.0)
    # the thread's time between ops (Python, the framework) is the next op's, and does not follow its size
    thread = g.edge_kind == _graph.E["thread"]
    gap = np.zeros(len(g.kind))
    np.add.at(gap, g.dst[thread], np.maximum(g.lag_ns[thread], 0))
    _gpu_work(g, facts, cpu, dur, floor, gap)
    wrap = np.minimum(wrap, dur - floor)
    rest = dur - floor - wrap
    # FSDP's own work inside another node (its post-backward reduce, its pre-backward unshard): FSDP's, not the node's
    # (on a CPU rank, where a node's work is its time; a GPU rank's is its kernels', which the range's time is not)
    on_cpu = ~np.isin(g.rank, list(facts.kernel_floor_ns))
    held = np.where(cpu & in_step & ~aside & on_cpu, np.minimum(in_fsdp, rest + floor), 0.0)
    floor -= np.maximum(held - rest, 0)
    rest -= np.minimum(held, rest)
    floor = floor + gap
    out = {}
    n_steps = 0
    for r in g.ranks:
        rr = g.rank == r
        st = np.unique(step_of[rr & in_step])
        k = max(len(st), 1)
        n_steps = max(n_steps, k)
        blocks = int(round(blocks_of.get(int(r), 0) / k / micro_batches))
        w = RankWork(int(r), blocks)
        for ph, sel in ((0, fwd), (1, bwd & ~unmapped)):
            for wh in (PRE, BLOCK, POST):
                for sp in (0, 1):
                    m = sel & rr & (where == wh) & (split == bool(sp)) & ~aside
                    w.work[ph, wh, sp] = (floor[m].sum() / k, rest[m].sum() / k)
                w.wrapper[ph, wh] = wrap[sel & rr & (where == wh) & ~aside].sum() / k
        # backward nodes with no forward op: token work spread like the mapped ones; the rest follows the parameters
        um = unmapped & rr & ~aside
        tok = um & facts.act
        mapped = w.work[1].sum(axis=2)
        share = mapped / mapped.sum() if mapped.sum() > 0 else np.array([[0, 1], [0, 0], [0, 0]], float)[:, :2]
        w.work[1] += share[..., None] * np.array([floor[tok].sum(), rest[tok].sum()]) / k if mapped.sum() > 0 else 0
        busy = dur + gap - held
        w.params_ns = float(busy[um & ~facts.act].sum()) / k
        opt = cpu & rr & in_step & (facts.phase == OPTIMIZER)
        w.optimizer_wrapper_ns = float(wrap[opt].sum()) / k
        w.optimizer_floor_ns = float(floor[opt].sum()) / k
        w.optimizer_ns = float(rest[opt].sum()) / k
        w.tp_glue_ns = float(busy[glue & rr].sum()) / k
        w.sharding_ns = float(busy[sharding & rr & ~glue & ~call].sum() + held[rr].sum()) / k
        w.coll_call_ns = float(busy[call & rr].sum()) / k
        known = fwd | bwd | aside | (facts.phase == OPTIMIZER)
        w.other_ns = float(busy[cpu & rr & in_step & ~known].sum()) / k
        if len(g.colls):
            present = g.colls.present_ranks.map(lambda x: int(r) in set(x)).to_numpy(bool)
            w.n_colls = present.sum() / k
        out[int(r)] = w
    params = _param_bytes(run)
    grads, largest = _grad_bytes(run)
    grads = {r: b / max(micro_batches, 1) for r, b in grads.items()}
    return Structure(out, _period(facts, next(iter(facts.blocks))), colwise, rowwise, tokens, hidden, elem or 4,
                     split_dims, heads, block_params * (elem or 4), params, grads, n_steps,
                     largest_grad_bytes=largest)


def _inside(g, run, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """Per graph node: (it starts inside a record_function range whose name starts with prefix, on its rank; the ns
    of its span such ranges cover). A node can hold such a range without starting in one: FSDP2's post-backward
    reduce runs inside the autograd node of its RegisterPostBackwardFunction, its pre-backward inside the node of the
    block output's grad_fn."""
    spans = run.sql("SELECT rank, ts_ns, ts_ns + dur_ns AS end_ns FROM events WHERE ph = 'X' AND "
                    "cat = 'user_annotation' AND starts_with(name, $p) AND dur_ns IS NOT NULL", {"p": prefix})
    starts = np.zeros(len(g.kind), bool)
    covered = np.zeros(len(g.kind))
    for r, x in spans.groupby("rank"):
        s0, e0 = union_spans(x.ts_ns.to_numpy(np.int64), x.end_ns.to_numpy(np.int64))
        before = np.cumsum(e0 - s0) - (e0 - s0)  # the ranges' ns before each span
        mine = np.flatnonzero(g.rank == r)
        a = g.start_ns[mine].astype(np.int64)
        b = a + g.dur_ns[mine].astype(np.int64)
        ia, ib = (np.searchsorted(s0, t, side="right") - 1 for t in (a, b))  # the last span begun by then

        def upto(t, i):  # the ranges' ns before time t
            j = np.maximum(i, 0)
            return np.where(i >= 0, before[j] + np.minimum(t, e0[j]) - s0[j], 0)

        starts[mine] = (ia >= 0) & (a < e0[np.maximum(ia, 0)])
        covered[mine] = upto(b, ib) - upto(a, ia)
    return starts, covered


def _gpu_work(g, facts: OpFacts, cpu: np.ndarray, dur: np.ndarray, floor: np.ndarray, gap: np.ndarray) -> None:
    """On a rank with GPU kernels the step follows the device: each host op's work becomes the time of the compute
    kernels it launched (the rank's smallest compute kernel their floor), and the host's gaps are not the step's.
    Updates dur, floor and gap in place."""
    if not facts.kernel_floor_ns:
        return
    nodes = g.nodes()
    comp = (g.kind == _graph.K["gpu"]) & (nodes.kernel_class.to_numpy(object) != "communication")
    launch = np.flatnonzero(g.edge_kind == _graph.E["launch"])
    rt, k = g.src[launch], g.dst[launch]
    keep = comp[k]
    rt, k = rt[keep], k[keep]
    for r in facts.kernel_floor_ns:
        host = np.flatnonzero(cpu & (g.rank == r))
        host = host[np.argsort(g.start_ns[host], kind="stable")]
        mine = g.rank[rt] == r
        at = np.searchsorted(g.start_ns[host], g.start_ns[rt[mine]], side="right") - 1
        ok = at >= 0
        work = np.zeros(len(host))
        n_k = np.zeros(len(host))
        np.add.at(work, at[ok], g.dur_ns[k[mine][ok]])
        np.add.at(n_k, at[ok], 1)
        dur[host] = work
        floor[host] = np.minimum(n_k * facts.kernel_floor_ns[r], work)
        gap[host] = 0.0


def _weights(ev: pd.DataFrame, rank: int, event_ids: np.ndarray, names: np.ndarray) -> float:
    """Elements of the weights and biases the linears and norms among these ops read (their global shapes)."""
    want = np.isin(names, ("aten::linear", "aten::layer_norm", "aten::rms_norm"))
    rows = ev[(ev["rank"] == rank) & ev.event_id.isin(event_ids[want])]
    total = 0
    for name, dims in zip(rows.name, rows.input_dims):
        if not isinstance(dims, str):
            continue
        d = json.loads(dims)
        args = d[1:3] if name == "aten::linear" else d[2:4] if name == "aten::layer_norm" else d[1:2]
        total += sum(int(np.prod(a)) for a in args if isinstance(a, list) and a)
    return float(total)


def _split_dims(ev: pd.DataFrame, rank: int, event_ids: np.ndarray, names: np.ndarray) -> tuple[set, int]:
    """(the widths a tensor-parallel split cuts among these split ops: each linear's weight's dimensions, global
    shapes; the attention heads the rank computes: its query's second dimension)."""
    rows = ev[(ev["rank"] == rank) & ev.event_id.isin(event_ids)]
    dims, heads = set(), 0
    for name, d in zip(rows.name, rows.input_dims):
        if not isinstance(d, str):
            continue
        a = json.loads(d)
        if name == "aten::linear" and len(a) > 1 and len(a[1]) == 2:
            dims.update(int(x) for x in a[1])
        elif name in MIXERS[:4] and a and len(a[0]) == 4:
            heads = max(heads, int(a[0][1]))
    return dims, heads


def _period(facts: OpFacts, r) -> int:
    got = facts.blocks.get(int(r))
    return int(got[0]) if got else 0


def _split(names: np.ndarray) -> tuple[int, int, np.ndarray]:
    """Column- and row-parallel linears in a run of blocks' ops (module docstring), and which of its ops a
    tensor-parallel split divides."""
    out = np.zeros(len(names), bool)
    state, mixed = "kept", False
    cw = rw = 0
    for i, n in enumerate(names):
        if n in LINEARS and i and names[i - 1] in LINEARS and names[i - 1] != n:
            out[i] = True  # a wrapper's GEMM (Megatron's linear Function, then its aten::mm): the same linear
            continue
        if n in LINEARS:
            out[i] = True
            if state == "split" and mixed:  # after an attention or activation: row-parallel, the split ends
                rw += 1
                state, mixed = "kept", False
            else:  # reads the hidden (or beside another column-parallel linear)
                cw += 1
                state = "split"
            continue
        if state == "split":
            out[i] = True
            if n in MIXERS:
                mixed = True
    return cw, rw, out


def _param_bytes(run) -> dict:
    """rank -> the bytes of the parameters its optimizer updates (analyses.memory.parameter_bytes)."""
    from analyses.memory import parameter_bytes

    rows = parameter_bytes(run).dropna(subset=["parameter_bytes"])
    return dict(zip(rows["rank"].astype(int), rows.parameter_bytes.astype(int)))


_GRAD_BYTES_SQL = """
WITH recv AS (SELECT DISTINCT rank, json_extract(input_dims, '$[0]')::VARCHAR AS shape FROM events
              WHERE ph = 'X' AND name IN ('gloo:recv', 'nccl:recv') AND input_dims IS NOT NULL),
one AS (SELECT c.rank, c.step, _tensor_arg_nelems(c.input_dims, 0)
                                   * _tensor_dtype_bytes(_tensor_first_type(c.input_types)) AS bytes
        FROM cpu_ops c LEFT JOIN recv r ON r.rank = c.rank AND r.shape = json_extract(c.input_dims, '$[0]')::VARCHAR
        WHERE c.name = 'torch::autograd::AccumulateGrad' AND c.step IS NOT NULL AND r.rank IS NULL),
g AS (SELECT rank, step, sum(bytes)::BIGINT AS bytes, max(bytes)::BIGINT AS largest FROM one GROUP BY rank, step)
SELECT rank, median(bytes) AS grad_bytes, max(largest) AS largest_grad_bytes FROM g GROUP BY rank
"""


def _grad_bytes(run) -> tuple[dict, dict]:
    """(rank -> the gradients AccumulateGrad receives a step (a DTensor's global shape: the model's parameters
    however they are sharded), less the leaves a pipeline's receive filled (a stage's input activation); rank -> the
    largest one gradient it receives)."""
    from analyses.memory import _shapes_macros

    _shapes_macros(run)
    rows = run.sql(_GRAD_BYTES_SQL)
    ranks = rows["rank"].astype(int)
    return dict(zip(ranks, rows.grad_bytes.astype(float))), dict(zip(ranks, rows.largest_grad_bytes.astype(float)))
