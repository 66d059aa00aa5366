"""A run re-laid out as other data, tensor and pipeline degrees, micro-batches, schedule and sharding, from its
traces alone (replay/structure.py reads what the trace shows; replay/dims.py its current layout).

The step of a layout (`step_ns`), per pipeline stage, on the source's own work:
- a micro-batch's forward (backward) on stage s: the blocks the stage holds (the model's blocks split evenly over
  the stages; the ops before the first block on the first stage, those after the last on the last) each taking
  floor + rest x (tokens' ratio) x (tp / tp' for the ops a tensor split divides); the global batch is kept
  (x [batch] scale), so a micro-batch's tokens go as 1 / (dp' x micro_batches');
- tensor parallelism: per block and micro-batch one all-reduce of the block's boundary tensor per row-parallel
  linear in the forward and one per column-parallel linear in the backward (the trace's own linears: structure),
  on the critical path; DTensor's glue as the source spends it per collective (none from a run without it);
- pipeline parallelism: a send of the boundary tensor per micro-batch and stage boundary, each way; the schedule
  (GPipe: every forward then every backward; 1F1B) replayed by the engine (replay/pipeline.py);
- data parallelism, sharding none or replicate: the gradients (the model's / (tp' x pp')) all-reduced in the
  source's buckets (DDP's 1 MiB first bucket and 25 MiB ones when the source has none) as the last micro-batch's
  backward readies them, one at a time on the link: what outlasts the backward is exposed; zero1 / zero2: a
  reduce-scatter of the gradients and an all-gather of the updated parameters; fsdp (pipeline 1, one micro-batch):
  per block and for the rest of the model an all-gather before its forward and again before its backward and a
  reduce-scatter after it, on one communication stream beside the computation (the engine);
- the optimizer: its ops' floors, a set per parameter tensor a rank updates (/ pp'), and the rest by the bytes it
  updates (/ dp' when sharded); gradient accumulation the gradients a rank holds, a micro-batch at a time; the rest
  of the step (data loading, ...) is kept;
- a tensor subclass's dispatch (DTensor's, as the run spent it: structure) is spent by a layout whose activations
  (tp' > 1) or parameters (tp' > 1, fsdp, replicate) are DTensors, and by no other; FSDP's own work (its FSDP::
  ranges) by a layout FSDP2 runs (fsdp, replicate), and by no other;
- a collective costs what the links model fitted on the run gives it alone on its links (held to the NICs' nominal
  rate where known), times what the run's own lone collectives of that op and class of link took over that (an
  algorithm as the backend runs it; lone: nothing else in flight on its ranks, nor, for one between hosts, on its
  hosts' other ranks, whose NICs it would share: it is timed with them to itself); a host's ranks in different
  groups of one dimension share its NIC; ranks are placed tensor innermost, then pipeline, then data,
  ranks_per_host consecutive ones a host.
The prediction is the run's own step (as replayed, with the scenario's other changes) x step_ns(new) /
step_ns(run's own layout): the formula is held to the run's measured step, and a layout changed to itself is the
run to the ns.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from analyses.memory import CATEGORIES
from tracekit.store.devices import sql_in

from .checks import ScenarioError
from .costs import P2P_OPS, flat_coefficients
from .dims import SCHEDULES, coll_dims, trace_layout
from .engine import Engine
from .links import INTER, INTRA, _of
from .pipeline import pipeline_makespan
from .structure import BLOCK, POST, PRE, Structure, structure

PIPELINE_SCHEDULES = SCHEDULES
SHARDINGS = ("none", "zero1", "zero2", "fsdp", "replicate")
# the shardings FSDP2's machinery runs (fully_shard; replicate_with_fsdp's replicate: the parameters whole on every
# rank, a stage's unsharded copy made before its forward and held through its backward, its gradients all-reduced)
FSDP2_SHARDINGS = ("fsdp", "replicate")
# the shardings whose ranks hold whole gradients and all-reduce them (DDP's, replicate's)
WHOLE_SHARDINGS = ("none", "replicate")
# the shardings whose ranks hold whole gradients at rest (ZeRO-1 shards only the optimizer state)
WHOLE_GRADIENTS = WHOLE_SHARDINGS + ("zero1",)
DDP_FIRST_BUCKET_BYTES = 1 << 20
DDP_BUCKET_BYTES = 25 << 20


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    schedule: str = "1f1b"
    sharding: str = "none"

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def describe(self) -> str:
        bits = [f"dp {self.dp}", f"tp {self.tp}", f"pp {self.pp}"]
        if self.pp > 1 or self.micro_batches > 1:
            bits.append(f"{self.micro_batches} micro-batch(es)" + (f" {self.schedule}" if self.pp > 1 else ""))
        if self.sharding != "none":
            bits.append(self.sharding)
        return ", ".join(bits)


@dataclass
class Costs:
    """A collective alone on the links (ns): the links model's latency steps and bytes per link of its op
    (replay/links.py's table: ring all-reduce 2(p-1) steps and 2(p-1)/p of the bytes, ...), at the capacity and
    latency the run's transfers fitted (replay/linkfit.py); over hosts of ranks_per_host consecutive ranks."""
    params: object  # replay.links.LinkParams
    ranks_per_host: int
    backend: str = "nccl"
    # (op, link class) -> what the run's lone collectives of that op on that class of link took (the shortest
    # participant), over what the links give them (an op's algorithm as the backend runs it: gloo's all-gather
    # takes ~1.4x a ring's time); what the run has none of: 1
    op_factor: dict = field(default_factory=dict)

    @property
    def reduce_scatter_op(self) -> str:
        """gloo has no reduce-scatter: FSDP (and ZeRO) all-reduce the gradients there (what an FSDP run on gloo
        records)."""
        return "all_reduce" if self.backend == "gloo" else "reduce_scatter"

    def ns(self, op: str, nbytes: float, group: int, stride: int, alone: bool = False) -> float:
        """alone: the collective has its hosts' NICs to itself (else the groups of its dimension share them)."""
        if group <= 1 or nbytes <= 0:
            return 0.0
        rph = self.ranks_per_host
        hosts = len({(k * stride) // rph for k in range(group)})
        c = INTER if hosts > 1 else INTRA
        # the groups of this dimension that a host's ranks belong to run their collective at once: they share its NIC
        sharing = len({r % stride for r in range(rph)}) if c == INTER and stride > 1 and not alone else 1
        a, f = flat_coefficients(np.array([op], object), np.array([float(group)]), "ring")
        lone = a[0] * self.params.step_ns(c) + f[0] * nbytes * sharing / _of(self.params.capacity, c)
        return float(lone * self.op_factor.get((op, c), 1.0))

    def with_run(self, run, g) -> "Costs":
        """These costs with op_factor measured on the run's collectives that had the links to themselves: per op,
        the median over them of the shortest participant's time (the last to arrive waits least: its time is the
        transfer, whatever the ranks' clocks) over what the links give it alone. One between hosts has them to
        itself only when no other collective between hosts is in flight on its hosts' other ranks: two data-parallel
        groups crossing the same NICs each see half their rate, and a factor read off them against a shared model
        would stand for neither."""
        c = g.colls
        if not len(c) or c.bytes.isna().all():
            return self
        n = np.array([len(x) for x in c.present_ranks])
        part = pd.DataFrame({"row": np.repeat(np.arange(len(c)), n),
                             "rank": np.concatenate([np.asarray(x, np.int64) for x in c.present_ranks]),
                             "event_id": np.concatenate([np.asarray(x, np.int64) for x in c.events])})
        # the participants' events only (a trace holds millions of others)
        ev = run.sql("SELECT rank, event_id, ts_ns, ts_ns + dur_ns AS end_ns FROM events WHERE ph = 'X' AND "
                     "dur_ns IS NOT NULL AND event_id IN (SELECT unnest($ids::BIGINT[]))",
                     {"ids": sorted(set(part.event_id.tolist()))})
        ev = ev.drop_duplicates(["rank", "event_id"]).set_index(["rank", "event_id"])
        got = ev.reindex(pd.MultiIndex.from_arrays([part["rank"], part.event_id]))
        part["start"], part["end"] = got.ts_ns.to_numpy(float), got.end_ns.to_numpy(float)
        part = part.dropna()
        # lone: no other collective in flight on any of its ranks while it ran there, nor, for one between hosts, on
        # any rank of its hosts (whose NICs it would share): each participation is checked among its rank's, and one
        # between hosts again among those between hosts on its host
        multi = c.n_hosts.fillna(1).to_numpy(np.int64) > 1  # between hosts
        between = part[multi[part.row.to_numpy()]]
        seen = pd.concat([part.assign(on=-1 - part["rank"]),
                          between.assign(on=between["rank"] // max(1, int(self.ranks_per_host)))])
        lone = np.ones(len(c), bool)
        for _, x in seen.sort_values(["on", "start"]).groupby("on"):
            s0, e0, rows = x.start.to_numpy(), x.end.to_numpy(), x.row.to_numpy()
            reach = np.maximum.accumulate(e0)
            clash = np.zeros(len(x), bool)
            clash[1:] = s0[1:] < reach[:-1]  # one that starts before an earlier one ends
            clash[:-1] |= e0[:-1] > s0[1:]  # one that ends after the next one starts
            lone[rows[clash]] = False
        took = (part.end - part.start).groupby(part.row).min()
        factors = {}
        base = replace(self, op_factor={})
        # a send returns once its bytes are handed over and a recv posted late finds them there: neither's time is
        # the transfer's (collectives.py times a pair by its recv from the later arrival), so p2p has no factor
        rows = [i for i in took.index if lone[i] and pd.notna(c.bytes.iat[i]) and str(c.op.iat[i]) not in P2P_OPS]
        if not rows:
            return self
        key = [(str(c.op.iat[i]), INTER if multi[i] else INTRA) for i in rows]
        model = np.array([base.ns(op, float(c.bytes.iat[i]), int(c.group_size.iat[i]), _stride(c.ranks.iat[i]),
                                  alone=True) for (op, _), i in zip(key, rows)])
        t = took[rows].to_numpy(float)
        for k in set(key):
            sel = np.array([x == k for x in key]) & (model > 0)
            if sel.any():
                factors[k] = float(np.median(t[sel] / model[sel]))
        return replace(self, op_factor=factors)


def _stride(ranks) -> int:
    """The distance between a group's consecutive ranks (1 for a group of one)."""
    r = sorted(int(x) for x in ranks)
    return r[1] - r[0] if len(r) > 1 else 1


@dataclass
class Work:
    """The source's work per block, per micro-batch, per token-scaled unit (see step_ns)."""
    block: np.ndarray  # [phase][split] -> (floor, rest) per block and micro-batch at the source's tokens
    pre: np.ndarray  # [phase][split] -> (floor, rest) per micro-batch (the first stage's)
    post: np.ndarray
    blocks: int  # the model's blocks
    tokens: float  # a source rank's micro-batch tokens
    optimizer_ns_per_byte: float  # beyond the floor
    params_ns_per_byte: float  # gradient accumulation and hooks, per gradient byte a micro-batch
    other_ns: float
    glue_ns_per_coll: float  # DTensor glue a tensor-parallel collective costs the source (0 without)
    call_ns: float  # CPU time of a collective call
    model_bytes: float  # the model's parameters
    buckets: list  # the data-parallel all-reduce's bucket shares (empty: DDP's defaults)
    # a tensor subclass's dispatch (DTensor's), ns: [phase][where] per block (where = block) or micro-batch, and the
    # optimizer's a step; spent only by a layout whose activations (tp > 1) or parameters (tp > 1, fsdp) are DTensors
    wrapper: np.ndarray = field(default_factory=lambda: np.zeros((2, 3)))
    optimizer_wrapper_ns: float = 0.0
    optimizer_floor_ns: float = 0.0  # the whole model's optimizer floors (its ops' floors and gaps: a set per tensor)
    sharding_ns: float = 0.0  # FSDP's own work a step (structure: its FSDP:: ranges), spent by an fsdp layout

    @property
    def has_backward(self) -> bool:
        return bool(self.block[1].sum() + self.pre[1].sum() + self.post[1].sum() > 0)


def work(st: Structure, src: Layout, dp_bucket_bytes: list) -> Work:
    ranks = list(st.ranks.values())
    blk = np.zeros((2, 2, 2))
    n = 0
    for w in ranks:
        if w.blocks > 0:
            blk += w.work[:, BLOCK] / (src.micro_batches * w.blocks)
            n += 1
    blk /= max(n, 1)
    # the ops around the blocks: the stage that holds them (the most of it on any rank)
    pre = max((w.work[:, PRE] for w in ranks), key=lambda a: a.sum()) / src.micro_batches
    post = max((w.work[:, POST] for w in ranks), key=lambda a: a.sum()) / src.micro_batches
    blocks = st_blocks(st, src)
    model_bytes = sum(st.grad_bytes.values()) / (src.dp * src.tp)
    held = [st.param_bytes.get(w.rank, 0) for w in ranks]
    opt = np.mean([w.optimizer_ns / b for w, b in zip(ranks, held) if b > 0]) if any(held) else 0.0
    grads = [st.grad_bytes.get(w.rank, 0) for w in ranks]
    par = np.mean([w.params_ns / (g * src.micro_batches) for w, g in zip(ranks, grads) if g > 0]) if any(grads) else 0
    n_tp = _tp_colls(st, src)
    glue = np.mean([w.tp_glue_ns for w in ranks]) / n_tp if n_tp > 0 else 0.0
    calls = [w.coll_call_ns / w.n_colls for w in ranks if w.n_colls > 0]
    total = sum(dp_bucket_bytes)
    wrap = np.zeros((2, 3))
    wrap[:, BLOCK] = np.mean([w.wrapper[:, BLOCK] / (src.micro_batches * w.blocks) for w in ranks if w.blocks > 0],
                             axis=0) if n else 0.0
    for wh in (PRE, POST):
        wrap[:, wh] = max((w.wrapper[:, wh] for w in ranks), key=lambda a: a.sum()) / src.micro_batches
    opt_wrap = float(np.mean([w.optimizer_wrapper_ns for w in ranks])) * src.pp  # the whole model's
    opt_floor = float(np.mean([w.optimizer_floor_ns for w in ranks])) * src.pp
    return Work(blk, pre, post, blocks, float(st.tokens), float(opt), float(par),
                float(np.mean([w.other_ns for w in ranks])), float(glue), float(np.mean(calls)) if calls else 0.0,
                float(model_bytes), [b / total for b in dp_bucket_bytes] if total > 0 else [], wrap, opt_wrap,
                opt_floor, float(np.mean([w.sharding_ns for w in ranks])))


def _tp_colls(st: Structure, lay: Layout) -> float:
    """Tensor-parallel collectives a rank calls a step (the structure's plan)."""
    if lay.tp <= 1:
        return 0.0
    blocks = np.mean([w.blocks for w in st.ranks.values()])
    return blocks * lay.micro_batches * (st.colwise + st.rowwise)


def step_ns(st: Structure, w: Work, lay: Layout, src: Layout, costs: Costs, batch_scale: float = 1.0) -> dict:
    """The step of layout lay on the source's work (module docstring): {"step_ns", and its parts}."""
    tokens = w.tokens * (src.dp * src.micro_batches) / (lay.dp * lay.micro_batches) * batch_scale
    k = tokens / w.tokens
    tp_div = src.tp / lay.tp

    def timed(a):  # [phase][split] -> (floor, rest): per phase ns
        return a[:, :, 0].sum(axis=1) + a[:, 0, 1] * k + a[:, 1, 1] * k * tp_div

    blk, pre, post = timed(w.block), timed(w.pre), timed(w.post)
    if lay.tp > 1:  # DTensor activations: their dispatch, as the run spent it (none from a run without it)
        blk, pre, post = blk + w.wrapper[:, BLOCK], pre + w.wrapper[:, PRE], post + w.wrapper[:, POST]
    boundary = tokens * st.hidden * st.element_bytes
    strides = {"tp": 1, "pp": lay.tp, "dp": lay.tp * lay.pp}
    tp_ar = costs.ns("all_reduce", boundary, lay.tp, strides["tp"]) if lay.tp > 1 else 0.0
    per_coll = w.glue_ns_per_coll + w.call_ns if lay.tp > 1 else 0.0
    tp_f = st.rowwise * (tp_ar + per_coll)
    tp_b = st.colwise * (tp_ar + per_coll)
    bounds = np.linspace(0, w.blocks, lay.pp + 1).round().astype(int)
    f, b = [], []
    for s in range(lay.pp):
        nb = bounds[s + 1] - bounds[s]
        f.append(nb * (blk[0] + tp_f) + (s == 0) * pre[0] + (s == lay.pp - 1) * post[0])
        b.append(nb * (blk[1] + tp_b) + (s == 0) * pre[1] + (s == lay.pp - 1) * post[1])
    p2p = costs.ns("send", boundary, 2, strides["pp"]) + w.call_ns if lay.pp > 1 else 0.0
    grads = w.model_bytes / (lay.tp * lay.pp)
    shard = lay.dp if lay.sharding not in WHOLE_SHARDINGS else 1
    dtensor_params = lay.tp > 1 or lay.sharding in FSDP2_SHARDINGS
    # a rank's optimizer: a floor per parameter tensor it updates (a stage's share of the model's; a shard is a tensor
    # still), the rest by the bytes
    parts = {"optimizer_ns": w.optimizer_floor_ns / lay.pp + w.optimizer_ns_per_byte * grads / shard
             + (w.optimizer_wrapper_ns / lay.pp if dtensor_params else 0.0),
             "accumulate_ns": w.params_ns_per_byte * grads * lay.micro_batches,
             "other_ns": w.other_ns,
             # FSDP's copies and hooks, as the run spent them (its units are the same model's); none elsewhere
             "sharding_ns": w.sharding_ns if lay.sharding in FSDP2_SHARDINGS else 0.0}
    if lay.sharding == "fsdp":  # with pipeline 1 and one micro-batch (target() refuses the rest)
        parts["compute_comm_ns"] = _fsdp(st, w, lay, blk, tp_f, tp_b, pre, post, grads, costs, strides["dp"])
    else:
        span = pipeline_makespan(f, b, int(round(p2p)), lay.micro_batches, lay.schedule)
        parts["compute_comm_ns"] = span
        # a trace without a backward (a forward profiled alone) syncs no gradients
        parts["dp_exposed_ns"] = (_dp_exposed(w, lay, b[-1] if lay.pp else 0.0, grads, costs, strides["dp"])
                                  if w.has_backward else 0.0)
    parts["step_ns"] = sum(parts.values())
    return parts


def _dp_exposed(w: Work, lay: Layout, last_bwd_ns: float, grads: float, costs: Costs, stride: int) -> float:
    """The data-parallel gradient sync outlasting the last micro-batch's backward (sharding none, replicate, zero1,
    zero2)."""
    if lay.dp <= 1 or grads <= 0:
        return 0.0
    if lay.sharding in ("zero1", "zero2"):
        return (costs.ns(costs.reduce_scatter_op, grads, lay.dp, stride) + costs.ns("all_gather", grads, lay.dp, stride)
                + 2 * w.call_ns)
    end = done = 0.0
    for sh in w.buckets or _ddp_buckets(grads):  # ready as the backward reaches them, sent one after another
        done += sh
        end = max(last_bwd_ns * done, end) + costs.ns("all_reduce", grads * sh, lay.dp, stride) + w.call_ns
    return max(0.0, end - last_bwd_ns)


def _ddp_buckets(grads: float) -> list:
    """DDP's bucket shares of the gradients: a 1 MiB first bucket, then 25 MiB ones."""
    sizes, left = [], grads
    cap = DDP_FIRST_BUCKET_BYTES
    while left > 0:
        sizes.append(min(cap, left))
        left -= sizes[-1]
        cap = DDP_BUCKET_BYTES
    return [s / grads for s in sizes]


def _fsdp(st, w: Work, lay: Layout, blk, tp_f, tp_b, pre, post, grads, costs: Costs, stride: int) -> float:
    """FSDP's step (pipeline 1, one micro-batch): the computation and one communication stream, on the engine."""
    unit_block = min(st.block_param_bytes, grads * lay.tp / max(w.blocks, 1)) / lay.tp
    root = max(grads - unit_block * w.blocks, 0.0)
    units = [root] + [unit_block] * w.blocks  # the rest of the model (its root module), then the blocks
    ag = [costs.ns("all_gather", u, lay.dp, stride) + w.call_ns for u in units]
    rs = [costs.ns(costs.reduce_scatter_op, u, lay.dp, stride) + w.call_ns for u in units]
    fwd = [pre[0] + post[0]] + [blk[0] + tp_f] * w.blocks
    bwd = [pre[1] + post[1]] + [blk[1] + tp_b] * w.blocks
    n_u = len(units)
    durs, src, dst = [0], [], []

    def node(d):
        durs.append(int(round(d)))
        return len(durs) - 1

    def edge(a, b_):
        src.append(a)
        dst.append(b_)

    comm_prev = comp_prev = 0
    ag_f = []
    for u in range(n_u):  # forward: each unit's all-gather, in order, before its forward
        a = node(ag[u])
        edge(comm_prev, a)
        comm_prev = a
        ag_f.append(a)
    f_nodes = []
    for u in range(n_u):
        x = node(fwd[u])
        edge(comp_prev, x)
        edge(ag_f[u], x)
        comp_prev = x
        f_nodes.append(x)
    # backward: the root (the head's backward comes first), then the blocks in reverse, each gathered again before
    # its backward (FSDP2 reshards after the forward) and its gradients reduced after it
    order = [0] + list(range(n_u - 1, 0, -1))
    for u in order:
        a = node(ag[u])
        edge(comm_prev, a)
        edge(f_nodes[-1], a)
        comm_prev = a
        x = node(bwd[u])
        edge(comp_prev, x)
        edge(a, x)
        comp_prev = x
        r = node(rs[u])
        edge(comm_prev, r)
        edge(x, r)
        comm_prev = r
    e = Engine(len(durs), src, dst, np.ones(len(src), bool), np.zeros(len(src), np.int64), source=0, t0_ns=0)
    return float(e.run(np.asarray(durs, np.int64)).end_ns.max())


def target(par, src: Layout, world: int, st: Structure, where: str) -> Layout:
    """The layout [parallelism] asks for: the degrees it gives, the run's for the rest; dp, when not given, keeps the
    world size. One clear error for a layout that cannot be."""
    tp = par.tp if par.tp is not None else src.tp
    pp = par.pp if par.pp is not None else src.pp
    if par.dp is not None:
        dp = par.dp
    elif world % (tp * pp):
        raise ScenarioError(f"{where}: [parallelism] tp x pp = {tp * pp} does not divide the run's {world} ranks: give "
                            f"dp as well (dp x tp x pp is the new world size)")
    else:
        dp = world // (tp * pp)
    m = par.micro_batches if par.micro_batches is not None else (src.micro_batches if pp > 1 else 1)
    new = Layout(dp, tp, pp, m, par.schedule or src.schedule, par.sharding or src.sharding)
    if pp > st_blocks(st, src):
        raise ScenarioError(f"{where}: [parallelism] pp = {pp}: the model has {st_blocks(st, src)} repeated blocks "
                            f"(what the trace's forward repeats): at most {st_blocks(st, src)} stages")
    heads = st.heads * src.tp
    cut = sorted(st.split_dims | ({heads} if heads else set()))
    for d in cut:
        if d % tp:
            raise ScenarioError(f"{where}: [parallelism] tp = {tp} does not divide {d}, which a tensor-parallel split "
                                f"cuts (the blocks' linear widths and attention heads: {cut})")
    if new.sharding == "fsdp" and (pp > 1 or m > 1):
        raise ScenarioError(f"{where}: [parallelism] sharding = 'fsdp' is modelled with pp = 1 and one micro-batch "
                            f"(asked: pp = {pp}, micro_batches = {m})")
    return new


def st_blocks(st: Structure, src: Layout) -> int:
    """The model's blocks: every rank's, over the replicas (dp x tp ranks hold the same ones)."""
    return int(round(sum(w.blocks for w in st.ranks.values()) / (src.dp * src.tp)))


def notes_for(src: Layout, new: Layout, st: Structure, w: Work, parts: dict, base: dict, costs: Costs) -> list[str]:
    out = [f"re-layout {src.describe()} -> {new.describe()} from the traces: {w.blocks} repeated blocks of "
           f"{st.period_ops} ops ({st.colwise} column- and {st.rowwise} row-parallel linears each), a micro-batch's "
           f"{st.tokens} tokens x {st.hidden} hidden at a block boundary; global batch kept; step x "
           f"{parts['step_ns'] / base['step_ns']:.3f} (the formula's {base['step_ns'] / 1e6:.1f} -> "
           f"{parts['step_ns'] / 1e6:.1f} ms; replay/relayout.py)"]
    if new.tp > 1 and src.tp == 1:
        out.append("tensor parallelism from a run without it: one all-reduce per row-parallel linear (forward) and "
                   "per column-parallel linear (backward), no DTensor glue (the run has none to measure)")
    if not w.has_backward:
        out.append("the trace holds no backward (a forward profiled alone): the forward's time is re-laid out, no "
                   "gradient is synchronised")
    if new.world != src.world:
        out.append(f"world {src.world} -> {new.world} ranks, {costs.ranks_per_host} a host")
    if costs.op_factor:
        out.append("collective ops as the run's lone ones ran them, x the links' time: "
                   + ", ".join(f"{op} on {c} {v:.2f}" for (op, c), v in sorted(costs.op_factor.items())))
    if new.sharding in FSDP2_SHARDINGS and src.sharding not in FSDP2_SHARDINGS:
        what = "FSDP" if new.sharding == "fsdp" else "replicate"
        out.append(f"{what} from a run without FSDP2: its copies and hooks are not in the run to measure")
    if new.sharding in ("fsdp", "zero1", "zero2") and not any(op == "all_gather" for op, _ in costs.op_factor):
        out.append("the run has no all-gather to measure: its all-gathers cost what the links give a ring")
    return out


def source_layout(run, g, facts):
    """(the run's own layout, as its traces show it; dims' TraceLayout, whose evidence says how)."""
    tl = trace_layout(run, g, facts.coll_act)
    return Layout(tl.dp, tl.tp, tl.pp, tl.micro_batches, tl.schedule or "1f1b", tl.sharding), tl


def _dp_buckets(g, tl, coll_act, src: Layout) -> list:
    """The bytes of the data-parallel all-reduces the run's first rank calls in its first profiled step (DDP's
    buckets), in order; [] when the run has none (sharded, or one replica)."""
    c = g.colls
    if src.dp <= 1 or src.sharding not in WHOLE_SHARDINGS or not len(c):
        return []
    first = min(g.ranks)
    mine = (c.op.astype(str).to_numpy() == "all_reduce") & (coll_dims(g, tl, coll_act) == "dp")
    mine &= c.bytes.notna().to_numpy() & np.array([first in set(x) for x in c.present_ranks], bool)
    steps = g.steps[(g.steps["rank"] == first) & ~g.steps["is_last"].astype(bool)]
    if not mine.any() or steps.empty:
        return []
    s0, s1 = int(steps.ts_ns.iloc[0]), int(steps.end_ns.iloc[0])
    at = c.first_arrival_ns.to_numpy(np.int64)
    return c.bytes[mine & (at >= s0) & (at < s1)].astype(float).tolist()


def step_scale(run, g, facts, par, link_params, nominal_gbps, gpus_per_node, batch_scale: float, where: str):
    """(what the new layout multiplies the run's replayed step by, notes, the new layout): the formula's step of the
    new layout over the run's own, both at the scenario's links and batch (module docstring)."""
    src, tl = source_layout(run, g, facts)
    st = structure(run, g, facts, src.micro_batches, where)
    new = target(par, src, src.world, st, where)
    hosts = run.sql("SELECT count(DISTINCT coalesce(hostname, CAST(rank AS VARCHAR))) AS n FROM ranks").n.iloc[0]
    rph_src = max(1, src.world // max(1, int(hosts)))
    prm = link_params
    if nominal_gbps:  # a link carries no more than its rate: a fit above it (a pipeline's sends) is held to it
        prm = replace(prm, capacity={**prm.capacity, INTER: min(_of(prm.capacity, INTER), float(nominal_gbps))})
    backend = str(run.sql("SELECT any_value(json_extract_string(distributed_info_json, '$.backend')) AS b "
                          "FROM ranks").b.iloc[0] or "nccl")
    measured = Costs(prm, rph_src, backend).with_run(run, g)
    costs = replace(measured, ranks_per_host=int(gpus_per_node or rph_src))
    w = work(st, src, _dp_buckets(g, tl, facts.coll_act, src))
    base = step_ns(st, w, src, src, measured, batch_scale)
    parts = step_ns(st, w, new, src, costs, batch_scale)
    ratio = parts["step_ns"] / base["step_ns"] if base["step_ns"] > 0 else 1.0
    notes = notes_for(src, new, st, w, parts, base, costs) + [f"the run's layout from its traces: {e}"
                                                              for e in tl.evidence]
    stages = {int(r): i for grp in tl.groups.get("pp", []) for i, r in enumerate(grp)}
    kp, unkept = _micro_batch_memory(run, g, facts, st, src, stages)
    if kp is not None:
        split = ", not a checkpointed block's input" if facts.checkpointed else ""
        how = ("the run's own memory curve re-sized" if _same_schedule(src, new) else
               f"each stage's {new.schedule if new.pp > 1 else 'micro-batch'} schedule walked, its gradients held "
               "from the first backward on" + (", which holds the most as the run's first backward did, its "
                                               "gradients filling as its blocks free what they kept"
                                               if kp.first_backward_last is not None else ""))
        notes.append(f"peak memory: a micro-batch keeps {kp.block:.0f} B a token a block, {kp.pre:.0f} before the "
                     f"blocks, {kp.post:.0f} after them (the run's [memory] events; tensor parallelism splits a "
                     f"block's only{split}); {how} (replay/activations.py)")
    # torch.distributed.pipelining's last stage keeps each micro-batch's output until the step ends, to merge them;
    # a layout without a pipeline re-laid out from a pipeline run holds its output as long (the run's loop holds the
    # step's outputs; a loop over one model's output holds it until the step ends as `out = model(x)` does)
    retained = _output_per_token(run, facts.analyses) if max(new.pp, src.pp) > 1 and kp is not None else 0.0
    return ratio, notes, Plan(src, new, st, w, batch_scale, kp, stages, unkept,
                              checkpointed=bool(facts.checkpointed), retained=retained)


def _micro_batch_memory(run, g, facts, st: Structure, src: Layout, stages: dict):
    """(what a micro-batch keeps per token (replay/activations.py), from the ranks whose peaks are judged; per such
    (rank, device type, device id), the bytes of activations the forward does not keep for the backward (its
    temporaries, a checkpoint's recompute) live after each of its [memory] events (_category_series' times)); (None,
    {}) without [memory] events. Kept in facts.analyses: it is the run's.
    """
    from .activations import measure
    from .memory import has_memory_events, peak_devices

    cache = facts.analyses
    if "_micro_batch_memory" in cache:  # the run's own: one what-if's scenarios share it
        return cache["_micro_batch_memory"]
    if not has_memory_events(run):
        return None, {}
    top = peak_devices(run, cache)
    series = _category_series(run, cache)
    devices = {k: series[k].index.to_numpy() for k in
               zip(top["rank"].astype(int), top.device_type.astype(int), top.device_id.astype(int)) if k in series}
    out = cache["_micro_batch_memory"] = measure(run, g, facts, int(st.tokens), devices, stages, src.pp, cache)
    return out


# the loss functions' operators: a loss runs on the model's output, outside FSDP2's module hooks
LOSS_OPS = ("aten::cross_entropy_loss", "aten::nll_loss_nd", "aten::nll_loss", "aten::mse_loss", "aten::l1_loss",
            "aten::smooth_l1_loss", "aten::huber_loss", "aten::binary_cross_entropy_with_logits", "aten::kl_div")

_LOSS_SPANS_SQL = """
WITH loss AS (
    SELECT rank, tid, ts_ns, ts_ns + dur_ns AS end_ns FROM events
    WHERE ph = 'X' AND cat = 'cpu_op' AND name IN {names} AND dur_ns IS NOT NULL),
outer_loss AS (  -- the outermost: a loss op inside another is the other's
    SELECT l.* FROM loss l WHERE NOT EXISTS (
        SELECT 1 FROM loss o WHERE o.rank = l.rank AND o.tid = l.tid AND o.ts_ns <= l.ts_ns AND o.end_ns >= l.end_ns
          AND (o.ts_ns < l.ts_ns OR o.end_ns > l.end_ns))),
seqs AS (  -- the autograd sequence numbers of the ops a loss ran
    SELECT DISTINCT e.rank, e.sequence_number AS seq FROM events e JOIN outer_loss l
      ON e.rank = l.rank AND e.tid = l.tid AND e.ts_ns >= l.ts_ns AND e.ts_ns < l.end_ns
    WHERE e.ph = 'X' AND e.cat = 'cpu_op' AND e.sequence_number IS NOT NULL AND e.sequence_number >= 0),
nodes AS (  -- their backward nodes, with the engine's evaluate_function around each
    SELECT b.rank, coalesce(min(w.ts_ns), b.ts_ns) AS ts_ns,
           coalesce(max(w.ts_ns + w.dur_ns), b.ts_ns + b.dur_ns) AS end_ns
    FROM events b JOIN seqs q ON b.rank = q.rank AND b.sequence_number = q.seq
    LEFT JOIN events w ON w.rank = b.rank AND w.tid = b.tid AND w.ph = 'X'
      AND w.name = 'autograd::engine::evaluate_function: ' || b.name AND w.ts_ns <= b.ts_ns
      AND w.ts_ns + w.dur_ns >= b.ts_ns + b.dur_ns
    WHERE b.ph = 'X' AND b.cat = 'cpu_op' AND contains(b.name, 'Backward') AND NOT starts_with(b.name, 'autograd::')
    GROUP BY b.rank, b.ts_ns, b.dur_ns)
SELECT rank, ts_ns, end_ns FROM outer_loss UNION ALL SELECT rank, ts_ns, end_ns FROM nodes
""".format(names=sql_in(LOSS_OPS))


_OUTPUT_SQL = """
SELECT median(CAST(json_extract(input_dims, '$[0]') AS BIGINT[])[-1]
              * _tensor_dtype_bytes(_tensor_first_type(input_types))) AS bytes_per_token
FROM events WHERE ph = 'X' AND cat = 'cpu_op' AND name IN {names} AND input_dims IS NOT NULL
  AND json_array_length(json_extract(input_dims, '$[0]')) >= 2
""".format(names=sql_in(LOSS_OPS))


def _output_per_token(run, cache: dict) -> float:
    """Bytes of the model's output per token: the loss's input (its last dimension, the vocabulary's logits, at its
    element size); 0 without a loss with shapes in the trace. Kept in cache."""
    from analyses.memory import _shapes_macros

    if "_output_per_token" not in cache:
        _shapes_macros(run)
        got = run.sql(_OUTPUT_SQL).bytes_per_token.iloc[0]
        cache["_output_per_token"] = 0.0 if pd.isna(got) else float(got)
    return cache["_output_per_token"]


def _outside_loss(run, cache: dict) -> dict:
    """Per (rank, device type, device id) whose peak is judged, whether each of its [memory] events is outside the
    loss (its operators, LOSS_OPS, and their backward nodes, by autograd sequence number): where an FSDP layout
    holds unsharded parameters (FSDP2 gathers a module's for its forward and its backward, in the module's hooks;
    the loss runs on the model's output, outside them). cache: where it is kept (the run's: a what-if's scenarios
    share it) beside _category_series'."""
    from .memory import has_memory_events

    if "_outside_loss" in cache:
        return cache["_outside_loss"]
    if not has_memory_events(run):
        return {}
    spans = run.sql(_LOSS_SPANS_SQL)
    out = cache["_outside_loss"] = {}
    for key, x in _category_series(run, cache).items():
        t = x.index.to_numpy(np.int64)
        mine = spans[spans["rank"] == key[0]]
        inside = np.zeros(len(t), bool)
        for a, b in zip(mine.ts_ns.to_numpy(np.int64), mine.end_ns.to_numpy(np.int64)):
            inside[np.searchsorted(t, a, side="left"):np.searchsorted(t, b, side="left")] = True
        out[key] = ~inside
    return out


# Korthikanti et al. 2022 ("Reducing Activation Recomputation"): of a transformer layer's 34 s.b.h activation bytes
# (16-bit, attention scores aside), 24 are inside the tensor-parallel regions and divide by t, 10 do not
TP_SPLIT_ACTIVATIONS = 24 / 34
# FSDP2 holds a module's unsharded parameters from its all-gather until it reshards: the root's (embedding, head,
# final norm) through the step, and a block's while it computes and while the next block's is prefetched
FSDP_BLOCKS_GATHERED = 2


def _tp_activations(src_tp: int, new_tp: int) -> float:
    """What a layer's activations per token become from tensor parallelism src_tp to new_tp: the share inside the
    tensor-parallel regions (TP_SPLIT_ACTIVATIONS) divides by the degree, the rest does not."""
    split = TP_SPLIT_ACTIVATIONS
    return ((1 - split) + split / new_tp) / ((1 - split) + split / src_tp)


def _kept_split(plan: "Plan", tp_f: float) -> float:
    """What tensor parallelism leaves of what a block keeps for the backward: its split of the activations (tp_f,
    _tp_activations); all of it where the run checkpoints its blocks, which then keep their input only, whole on
    every rank of a tensor-parallel group (Korthikanti et al. 2022: without sequence parallelism)."""
    return 1.0 if plan.checkpointed else tp_f


def _block_bytes(st: "Structure", w: Work) -> float:
    """A block's parameters, unsharded: its linears' and norms' in the trace's shapes, at most the model's share."""
    return min(st.block_param_bytes, w.model_bytes / max(w.blocks, 1))


def _gathered(st: "Structure", w: Work, lay: Layout) -> float:
    """Bytes of unsharded parameters an FSDP rank of lay holds at once: the root's and FSDP_BLOCKS_GATHERED
    blocks', split by tensor parallelism."""
    block = _block_bytes(st, w)
    root = max(w.model_bytes - block * w.blocks, 0.0)
    return (root + min(FSDP_BLOCKS_GATHERED, w.blocks) * block) / lay.tp


def _in_flight(lay: Layout, stage: int) -> int:
    """Micro-batches whose activations a stage holds at once: all of them under GPipe, P - s under 1F1B (at most
    m), one without a pipeline (each micro-batch's backward frees its activations before the next forward)."""
    if lay.pp <= 1:
        return 1
    return lay.micro_batches if lay.schedule == "gpipe" else min(lay.pp - stage, lay.micro_batches)


def _held(w: Work, lay: Layout, what: str) -> float:
    """Bytes of parameters / gradients / optimizer state (Adam's two moments) a rank of lay holds at rest."""
    per = w.model_bytes / (lay.tp * lay.pp)
    sharded = {"parameters": lay.sharding == "fsdp", "gradients": lay.sharding not in WHOLE_GRADIENTS,
               "optimizer_state": lay.sharding in ("zero1", "zero2", "fsdp")}
    return per / (lay.dp if sharded[what] else 1)


def _gradients(grads: np.ndarray, w: Work, src: Layout, new: Layout, own: float = 0.0,
               largest: float = 0.0) -> np.ndarray:
    """The run's gradient bytes after each event (grads) as the new layout holds them: re-sized by the bytes each
    layout holds at rest (_held). What a rank holds beyond its gradients at rest is transient, and re-sized as what
    it is, not as the rank's share:
    - an FSDP run's are its unsharded gradients, a block's staged for its reduce-scatter: whole already, an FSDP
      layout holds them as its blocks' (/ tp x pp), another none (its gradients at rest are whole);
    - another run's (beyond own, the parameters its optimizer updates, where it holds whole gradients) are a
      micro-batch's gradients from its second on, each held while AccumulateGrad adds it to the one before. A layout
      of one micro-batch a step has none; one of several has the run's or, from a run of one micro-batch a step,
      one gradient of the largest (largest: what AccumulateGrad received), from its first backward on."""
    rest = _held(w, src, "gradients")
    ratio = _held(w, new, "gradients") / max(rest, 1.0)
    if src.sharding == "fsdp":
        staged = np.clip(grads - rest, 0.0, None)
        keep = (src.tp * src.pp) / (new.tp * new.pp) if new.sharding == "fsdp" else 0.0
        return np.minimum(grads, rest) * ratio + staged * keep
    at_rest = max(own, rest) if src.sharding in WHOLE_GRADIENTS else rest
    transient = np.clip(grads - at_rest, 0.0, None)
    if new.micro_batches <= 1:
        transient = np.zeros_like(transient)
    elif src.micro_batches <= 1:
        transient = np.where(grads > 0, largest, 0.0)
    return np.minimum(grads, at_rest) * ratio + transient


def _state_parameters(ms: pd.DataFrame, rank: int, device_type: int, device_id: int) -> float:
    """The parameter bytes memory_breakdown took out of the bytes made before profiling at the rank's peak (its
    split: min(those bytes, P); none without the parameters' shapes, or on another device than the state's)."""
    row = ms[(ms["rank"] == rank) & (ms.device_type == device_type) & (ms.device_id == device_id)]
    if not len(row) or pd.isna(row.parameter_bytes.iloc[0]):
        return 0.0
    return max(0.0, min(float(row.pre_profiling_bytes_at_peak.iloc[0]), float(row.parameter_bytes.iloc[0])))


def _comm_kept(src: Layout, new: Layout) -> float:
    """The share of the run's communication buffers the new layout keeps: FSDP2's gradient staging (fsdp's
    reduce-scatter, replicate's all-reduce) where FSDP2 still runs, split by the new tensor parallelism from a run
    without it; tensor parallelism's collective outputs where it still splits tensors (a data-parallel all-reduce
    works in place)."""
    gone = (src.sharding in FSDP2_SHARDINGS and new.sharding not in FSDP2_SHARDINGS) or (src.tp > 1 and new.tp == 1)
    if gone:
        return 0.0
    # a run of FSDP2 without tensor parallelism holds FSDP2's staging only: a block's unsharded gradients, which
    # tensor parallelism splits
    return 1.0 / new.tp if src.sharding in FSDP2_SHARDINGS and src.tp == 1 else 1.0


def _category_series(run, cache: dict) -> dict:
    """Per (rank, device type, device id), its bytes per category after each of its [memory] events
    (memory_category_timeline, each category held until its next row): one row per event time, a column per
    category. The timeline is split once, not filtered per rank, and kept in cache (memory._memory_analysis's)."""
    from .memory import _memory_analysis

    if "_category_series" in cache:
        return cache["_category_series"]
    tl = _memory_analysis(run, cache, "memory_category_timeline")
    out = cache["_category_series"] = {}
    for key, x in tl.groupby(["rank", "device_type", "device_id"], sort=False):
        wide = x.pivot_table(index="ts_ns", columns="category", values="bytes", aggfunc="last").sort_index().ffill()
        out[tuple(int(k) for k in key)] = wide.reindex(columns=list(CATEGORIES)).fillna(0.0)
    return out


def _same_schedule(a: Layout, b: Layout) -> bool:
    """Whether two layouts run a stage's micro-batches alike: the same pipeline depth, micro-batches and schedule."""
    return (a.pp, a.micro_batches, a.schedule if a.pp > 1 else None) == (b.pp, b.micro_batches,
                                                                           b.schedule if b.pp > 1 else None)


def _stage_peaks(kp, new: Layout, s: int, bounds: np.ndarray, tokens: float, tp_f: float, grads: float,
                 tp_block: float, retained: float) -> tuple[float, float, float]:
    """Stage s of the new layout: its activations, transients and gradients at their fullest over its schedule,
    at a forward's end or a backward's start, in a backward past its head and at the first backward's end
    (activations.stage_peaks), a micro-batch of `tokens` tokens; tp_f: what tensor parallelism leaves of the
    transients, tp_block of what a block keeps (_kept_split); retained: the bytes per token the last stage holds of
    each micro-batch until the step ends (Plan.retained)."""
    from .activations import schedule, stage_peaks

    last = s == new.pp - 1
    keeps = kp.micro_batch(bounds[s + 1] - bounds[s], s == 0, last, tp_block) * tokens
    return stage_peaks(schedule(new.pp, s, new.micro_batches, new.schedule), keeps,
                      (kp.forward_last if last else kp.forward_rest) * tokens * tp_f,
                      (kp.backward_last if last else kp.backward_rest) * tokens * tp_f, grads,
                      (kp.over_kept_last if last else kp.over_kept_rest) * tokens * tp_f,
                      retained * tokens if last else 0.0, kp.post * tokens if last else 0.0,
                      _first_backward(kp.first_backward_last if last else kp.first_backward_rest, tokens * tp_f))


def _first_backward(curve: np.ndarray | None, per_token: float) -> np.ndarray | None:
    """A run's first backward (Kept.first_backward_*) with its transient in bytes of a micro-batch's tokens and split
    (per_token: tokens x what tensor parallelism leaves)."""
    return None if curve is None else curve * [1.0, per_token]


def predict_peak(run, plan: "Plan", cache: dict) -> pd.DataFrame:
    """Per rank of the run (its device that can run out: analyses.memory.memory_limiting_devices), the measured peak
    and the new layout's predicted peak (the fullest stage of it). Empty without [memory] events. cache: where the
    memory analyses are read once (memory._memory_analysis).

    The state: parameters, gradients and optimizer state by the bytes a rank holds (the model's / (tp x pp), / dp
    where sharded). The parameters are the state (what memory_breakdown split off the bytes made before profiling at
    the peak: memory_model_state) and, on a run FSDP2 runs, the unsharded copies it makes (the rest: fsdp's
    all-gathers, replicate's copy of the stage): a layout of the same sharding has them (/ tp x pp), another none;
    an FSDP layout from a run without them holds what FSDP2 gathers at once (_gathered; none while the loss runs,
    outside FSDP2's module hooks: _outside_loss) and, while the backward
    holds gradients, a block's unsharded gradients staged for its reduce-scatter; a replicate layout from a run
    without them a copy of its stage's parameters (/ tp) throughout. The gradients by the bytes each layout holds at
    rest, an FSDP run's staged unsharded ones and a pipeline's accumulation transients aside (_gradients).

    Where the new layout runs a stage's micro-batches as the run does (_same_schedule): the largest, over the run's
    [memory] events, of memory_category_timeline's categories each re-sized, a pipeline's rank as its own stage of
    the new layout (the new layout may peak elsewhere than the run: an FSDP run in its backward, where its gathered
    parameters and gradients add up, DDP at the loss) -- activations by what a stage keeps over what the rank keeps
    (replay/activations.py: its blocks, the embedding's output on the first stage, the head's on the last, the
    micro-batches in flight, _in_flight; tensor parallelism's split of a block's, _tp_activations, none of a
    checkpointed block's input, _kept_split), what the forward does not keep for the backward (its temporaries, a
    checkpoint's recompute) by the tokens and the split; other (the temporaries) by the tokens, as the memory
    what-ifs take it, and outside the loss (_outside_loss) by the split; communication buffers as measured where
    the new layout keeps what made them (_comm_kept). Otherwise (another pipeline depth, schedule or micro-batch
    count), each new stage's schedule walked (activations.stage_peaks) on the rank's largest state and gradients,
    an FSDP layout's unsharded copies aside at the last stage's loss: the run's own curve holds its own
    micro-batches in its own order."""
    from .memory import PEAK_COLUMNS, _memory_analysis, peak_devices

    top = peak_devices(run, cache)
    if not len(top):
        return pd.DataFrame(columns=PEAK_COLUMNS)
    series = _category_series(run, cache)
    ms = _memory_analysis(run, cache, "memory_model_state")
    src, new, st, w = plan.src, plan.new, plan.structure, plan.work
    tokens = w.tokens * (src.dp * src.micro_batches) / (new.dp * new.micro_batches) * plan.batch_scale
    tp_f = _tp_activations(src.tp, new.tp)
    tp_block = _kept_split(plan, tp_f)
    bounds = np.linspace(0, w.blocks, new.pp + 1).round().astype(int)
    block = _block_bytes(st, w)
    held = {c: _held(w, new, c) / max(_held(w, src, c), 1.0) for c in ("parameters", "optimizer_state")}
    kp = plan.kept
    # whether each event is outside the loss (_outside_loss): where an FSDP layout holds unsharded parameters, and
    # where tensor parallelism splits the temporaries
    outside = _outside_loss(run, cache) if tp_f != 1.0 or new.sharding == "fsdp" else {}
    rows = []
    for r, dt, di, peak in zip(top["rank"], top.device_type, top.device_id, top.peak_allocated_bytes):
        cat = series.get((int(r), int(dt), int(di)), pd.DataFrame(0.0, index=[0], columns=list(CATEGORIES)))
        out_loss = outside.get((int(r), int(dt), int(di)), np.ones(len(cat), bool))
        mine = st.ranks.get(int(r))
        blocks_src = max(mine.blocks if mine else w.blocks / src.pp, 1)
        stage_src = plan.stages.get(int(r), 0)
        params = cat.parameters.to_numpy()
        state_params = np.minimum(params, _state_parameters(ms, r, dt, di))
        copies = np.zeros(len(cat))
        if new.sharding == src.sharding and new.sharding in FSDP2_SHARDINGS:  # the copies the run's FSDP2 made
            copies = (params - state_params) * (src.tp * src.pp) / (new.tp * new.pp)
        elif new.sharding == "replicate":  # a stage's unsharded copy, through its forward and backward
            copies = np.full(len(cat), _held(w, new, "parameters"))
        elif new.sharding == "fsdp":  # what FSDP2 gathers (none while the loss runs), and stages for a
            # reduce-scatter in the backward
            copies = (np.where(out_loss, _gathered(st, w, new), 0.0)
                      + np.where(cat.gradients.to_numpy() > 0, block / new.tp, 0.0))
        state = copies + state_params * held["parameters"]
        state += cat.optimizer_state.to_numpy() * held["optimizer_state"]
        grads = _gradients(cat.gradients.to_numpy(), w, src, new, float(st.param_bytes.get(int(r), 0)),
                           float(st.largest_grad_bytes.get(int(r), 0)))
        act_src = cat.activations.to_numpy()
        if kp is not None and not _same_schedule(src, new):
            # another micro-batch schedule: each new stage's schedule walked (replay/activations.py), on this rank's
            # state and gradients; the last stage's forward ends and backward starts are its loss's, where an FSDP
            # layout holds none of its unsharded copies (FSDP2 gathers in a module's hooks, the loss runs outside
            # them, and no block's gradients are staged yet): it holds them from its blocks' backward on, the head's
            # bytes freed
            state_all = float(state.max(initial=0.0))
            state_loss = float((state - copies).max(initial=0.0)) if new.sharding == "fsdp" else state_all
            best = 0.0
            for s in range(new.pp):
                ends, blocks, first_end = _stage_peaks(kp, new, s, bounds, tokens, tp_f,
                                                       float(grads.max(initial=0.0)), tp_block, plan.retained)
                best = max(best, (state_loss if s == new.pp - 1 else state_all) + ends,
                           state_all + max(blocks, first_end))
            rows.append((int(r), int(dt), int(di), int(peak), int(round(best))))
            continue
        # the run's own curve: what a stage keeps (replay/activations.py: its blocks, the embedding's output on the
        # first, the head's on the last, its micro-batches in flight) over what this rank keeps
        own = (kp.micro_batch(blocks_src, stage_src == 0, stage_src == src.pp - 1) * w.tokens
               * _in_flight(src, stage_src) if kp is not None else 0.0)
        # other (the temporaries) follows the tokens a rank holds, as in the memory what-ifs (memory._follows_tokens),
        # and outside the loss tensor parallelism's split, as the forward's unkept activations do: a checkpointed
        # run peaks in a block's backward, whose temporaries (the gradients of the block's activations) it splits;
        # the loss's (its operators and their backward nodes, _outside_loss) stay whole
        fixed = (cat.communication_buffers.to_numpy() * _comm_kept(src, new)
                 + cat.other.to_numpy() * tokens / w.tokens * np.where(out_loss, tp_f, 1.0))
        best = 0.0
        # what the forward does not keep (its temporaries, a checkpoint's recompute) follows the tokens and the split
        unkept = plan.unkept_act.get((int(r), int(dt), int(di)), np.zeros(len(cat)))
        # each new stage on the run's rank of that stage where the depth is the run's (a stage's curve holds its
        # own ends: the first's embedding, the last's head and loss), else every new stage on each rank
        same_depth = src.pp == new.pp > 1 and int(r) in plan.stages
        for s in ([stage_src] if same_depth else range(new.pp)):
            if own > 0:
                act = ((act_src - unkept) * (kp.micro_batch(bounds[s + 1] - bounds[s], s == 0, s == new.pp - 1,
                                                            tp_block) * tokens * _in_flight(new, s)) / own
                       + unkept * tokens / w.tokens * tp_f)
            else:
                act = (act_src * (tokens / w.tokens) * tp_f * _in_flight(new, s) / _in_flight(src, stage_src)
                       * (bounds[s + 1] - bounds[s]) / blocks_src)
            best = max(best, float((fixed + state + grads + act).max(initial=0.0)))
        rows.append((int(r), int(dt), int(di), int(peak), int(round(best))))
    return pd.DataFrame(rows, columns=["rank", "device_type", "device_id", "measured_peak_alloc_bytes",
                                       "predicted_peak_alloc_bytes"])


@dataclass
class Plan:
    """A re-layout as the what-if decided it: the run's layout and the new one, what the trace showed, the work."""
    src: Layout
    new: Layout
    structure: Structure
    work: Work
    batch_scale: float = 1.0
    kept: "Kept | None" = None  # what a micro-batch's forward keeps per token (replay/activations.py)
    stages: dict = field(default_factory=dict)  # the run's rank -> its pipeline stage (none without a pipeline)
    # (rank, device type, device id) -> the activations its forward does not keep (its temporaries, a checkpoint's
    # recompute) after each event
    unkept_act: dict = field(default_factory=dict)
    # the run recomputes its blocks (activation checkpointing): a block keeps its input only (_kept_split)
    checkpointed: bool = False
    # bytes per token of a micro-batch the new layout's last stage holds after its backward, until the step ends:
    # the model's output, which torch.distributed.pipelining keeps to merge (_output_per_token), and a layout without
    # a pipeline from a pipeline run as long; 0 where neither has a pipeline (the run's own curve shows its loop's)
    retained: float = 0.0
