"""The parallel layout a trace shows (TraceLayout: the degrees, the sharding, the pipeline's micro-batches and
schedule, each dimension's groups) and which dimension each collective of the dependency graph belongs to
(coll_dims). The trace alone suffices; run.json's `parallel` block only cross-checks it.

The rules, in the order they apply:

1. Named groups. The `pg_config` entries of every rank's distributedInfo, unioned (each rank lists the groups it
   belongs to), name dimensions through `pg_desc`: Megatron's (megatron/core/parallel_state.py:
   TENSOR_MODEL_PARALLEL_GROUP -> tp, PIPELINE_MODEL_PARALLEL_GROUP -> pp, DATA_PARALLEL_GROUP and
   DATA_PARALLEL_GROUP_WITH_CP -> dp, CONTEXT_PARALLEL_GROUP -> cp, EXPERT_MODEL_PARALLEL_GROUP -> ep,
   EXPERT_TENSOR_PARALLEL_GROUP -> etp, EXPERT_DATA_PARALLEL_GROUP -> edp; their _GLOO / _AG copies and the
   partial and hierarchical sub-groups belong to the same dimension without setting its degree; the combined
   groups keep a combined name, "tp-pp", "tp-dp-cp", ..., and are no dimension of their own) and DeviceMesh's
   (`mesh_<dim>`: dp, dp_shard, dp_replicate, fsdp, hsdp, data -> dp; tp, tensor -> tp; pp, pipe, pipeline -> pp;
   cp, context -> cp; ep, expert -> ep; a flattened mesh dimension such as dp_shard_cp keeps its name).
   `default_pg` (the world) is no dimension; neither is a group whose description names none ("undefined").
   A degree is its groups' size (the largest: sub-groups are smaller; dp_shard x dp_replicate when DeviceMesh
   splits dp); a dimension without a group is 1 unless rule 2 tells it, or dp takes the rest of the world when the
   named degrees leave a whole factor of it.
2. Unnamed (every collective on one world-sized group, or distributedInfo without pg_config) -- from what the
   collectives carry, per step: sends / recvs carrying the step's tokens -> pp, its degree the stages that pass
   them on (all ranks: world); collectives carrying tokens (tensor parallelism's all-reduces, sequence
   parallelism's all-gathers and reduce-scatters) -> tp = world; all-gathers of non-token tensors in the forward
   -> dp = world with sharding "fsdp"; any other collective -> dp = world. The first that fires decides; it names
   itself in `evidence`. A collective carries tokens when op_facts' coll_act says so or, for a collective whose
   participants are device kernels (which op_facts does not see), when the call that launched it
   (`record_param_comms`) holds a tensor of two or more dimensions that is no parameter's shape.
3. A collective on a named group takes that group's dimension (g.colls.pg_name matched to pg_config's pg_name,
   else its ranks matched to a dimension's group); a send / recv (group_size 2, possibly on the world's group)
   between two ranks of one pipeline group is "pp". Unnamed: by rule 2's kinds. What belongs to no dimension
   (the world's group in a layout that names its dimensions) is "world".
4. sharding "fsdp": all-gathers of non-token tensors on the dp dimension, some of them in the forward (FSDP /
   ZeRO-3 gather the parameters before use); FSDP2's `FSDP::all_gather` record_function ranges are quoted as evidence when present.
   sharding "replicate": a dp dimension with no such all-gathers, whose forward runs FSDP2's `FSDP::pre_forward`
   ranges (replicate_with_fsdp's replicate: the parameters whole on every rank, copied before each forward).
5. micro_batches (pp > 1): the forward sends of the first stage per step (the median over steps); the first
   stage is the sender of a pipeline's earliest transfer, the next stage the receiver of a stage's first send.
   schedule: "gpipe" when on every stage each step's backward transfers (gradients, against the stage order)
   complete only after its last forward transfer (activations), "1f1b" when a stage interleaves them; None
   without pipeline parallelism, with one micro-batch, or with no backward transfers.
6. run.json's `parallel` block (replay/parallelism.layout) cross-checks: where it disagrees the trace's figures
   stay and `evidence` says so. Only when the trace tells no degree at all does the block give them
   (source "run.json").
7. Nothing tells a degree (one rank, no collectives): world = dp = tp = pp = 1 and so on. The trace contradicts
   itself (the named degrees' product is not the world, and no unnamed dimension takes the rest; ranks disagree on
   the world size): TracekitError, one line.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analyses.comms import process_group_configs
from tracekit.errors import TracekitError

from .costs import P2P_OPS
from .memory import BACKWARD_PREFIX

SHARDING = ("none", "fsdp", "replicate")
SCHEDULES = ("gpipe", "1f1b")
# the degrees whose product is the world (ep and the expert dimensions are carved out of them)
WORLD_DIMS = ("dp", "tp", "pp", "cp")
# Megatron's group descriptions (megatron/core/parallel_state.py, create_group(group_desc=...)), after dropping the
# _GLOO / _AG suffixes: the dimension and whether the group's size is the dimension's degree
MEGATRON_GROUPS = {
    "TENSOR_MODEL_PARALLEL_GROUP": ("tp", True),
    "PIPELINE_MODEL_PARALLEL_GROUP": ("pp", True),
    "DATA_PARALLEL_GROUP": ("dp", True),
    "DATA_PARALLEL_GROUP_WITH_CP": ("dp", False),  # dp x cp: the gradients' group, not dp's degree
    "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": ("dp", False),
    "CONTEXT_PARALLEL_GROUP": ("cp", True),
    "EXPERT_MODEL_PARALLEL_GROUP": ("ep", True),
    "EXPERT_TENSOR_PARALLEL_GROUP": ("etp", True),
    "EXPERT_DATA_PARALLEL_GROUP": ("edp", True),
    "INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP": ("edp", False),
    "INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP": ("edp", False),
    "MODEL_PARALLEL_GROUP": ("tp-pp", False),
    "EMBEDDING_GROUP": ("pp", False),  # the first and last stages' tied embeddings
    "POSITION_EMBEDDING_GROUP": ("pp", False),
    "TENSOR_AND_DATA_PARALLEL_GROUP": ("tp-dp", False),
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": ("tp-dp-cp", False),
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": ("tp-cp", False),
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": ("etp-ep", False),
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": ("etp-ep-pp", False),
    "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP": ("etp-ep-pp", False),
    "AMAX_REDUCTION_GROUP": ("tp-dp", False),
}
# DeviceMesh's dimension names (its groups are described `mesh_<dim>`)
MESH_DIMS = {"dp": "dp", "dp_shard": "dp", "dp_replicate": "dp", "fsdp": "dp", "hsdp": "dp", "ddp": "dp",
             "data": "dp", "data_parallel": "dp", "tp": "tp", "tensor": "tp", "tensor_parallel": "tp", "pp": "pp",
             "pipe": "pp", "pipeline": "pp", "cp": "cp", "context": "cp", "ep": "ep", "expert": "ep"}
# when DeviceMesh splits dp, the degree is their product
_DP_SPLIT = ("dp_shard", "dp_replicate")
# the order a collective's ranks are matched to the dimensions' groups when two groups hold the same ranks
_MATCH_ORDER = ("pp", "tp", "cp", "ep", "dp")


@dataclass(frozen=True)
class TraceLayout:
    """The parallel layout a trace shows (module docstring: the rules)."""
    world: int
    dp: int
    tp: int
    pp: int
    sharding: str  # "none" | "fsdp" (parameters all-gathered before use: FSDP / ZeRO-3) | "replicate" (FSDP2's)
    micro_batches: int  # pipeline micro-batches per step (1 without pipeline parallelism)
    schedule: str | None  # "gpipe" | "1f1b" | None (no pipeline, or not tellable)
    groups: dict  # dim name -> list of rank lists (pp's in stage order)
    source: str  # "trace" | "run.json"
    evidence: tuple  # one short sentence per degree saying what in the trace told it
    # pg_name -> dimension of the named groups (rule 3 matches g.colls.pg_name against it)
    pg_dims: dict = field(default_factory=dict)

    @property
    def degrees(self) -> dict:
        """Every dimension with more than one rank: {name: degree}."""
        out = {d: getattr(self, d) for d in ("dp", "tp", "pp")}
        for d, gs in self.groups.items():
            if d not in out and "-" not in d and gs:
                out[d] = max(len(x) for x in gs)
        return {d: n for d, n in out.items() if n > 1}


def trace_layout(run, g, coll_act, *, cross_check: bool = True) -> TraceLayout:
    """The layout the trace shows (module docstring). g: depgraph.build(run); coll_act: op_facts(run, g).coll_act,
    one flag per row of g.colls. cross_check=False leaves run.json's `parallel` block out altogether."""
    world = _world(run, g)
    named = _named_groups(run)
    colls = g.colls
    tokens = _token_colls(run, g, coll_act)
    fwd = _in_forward(g)
    evidence: list[str] = [named.attrs["unnamed"]] if "unnamed" in named.attrs else []
    groups: dict = {}
    deg = {d: 1 for d in WORLD_DIMS}
    for d, grp in named.groupby("dim", sort=True):
        groups[d] = _degree_groups(grp)
        n = _named_degree(grp)
        if n is not None and "-" not in d and (d in deg or n > 1):
            deg[d] = n
            descs = ", ".join(sorted(set(grp.pg_desc)))
            evidence.append(f"{d} = {n}: {len(grp)} process group(s) {descs} in distributedInfo")
    named_dims = {d for d in WORLD_DIMS if d in groups}
    if "pp" not in named_dims:
        chains = _pipeline_chains(g, tokens)
        if chains:
            groups["pp"], deg["pp"] = chains, max(len(c) for c in chains)
            n_p2p = int(colls.op.isin(P2P_OPS).sum())
            evidence.append(f"pp = {deg['pp']}: {n_p2p} sends/recvs carrying tokens pass the step along "
                            f"{len(chains)} chain(s) of {deg['pp']} stages (no pipeline group is named)")
    if world > 1 and not named_dims - {"pp"}:
        _unnamed(colls, tokens, fwd, world, deg, groups, evidence)
    product = int(np.prod([deg[d] for d in WORLD_DIMS]))
    if product < world and world % product == 0 and "dp" not in named_dims:
        deg["dp"] = world // product
        groups["dp"] = _complement_groups(world, groups, deg)
        evidence.append(f"dp = {deg['dp']}: the rest of the world ({world} ranks) once "
                        + " x ".join(f"{d} {deg[d]}" for d in WORLD_DIMS if d != "dp" and deg[d] > 1)
                        + " are taken (no data-parallel group is named)")
        product = world
    if product != world:
        told = " x ".join(f"{d} {deg[d]}" for d in WORLD_DIMS)
        raise TracekitError(f"[dims] the trace contradicts itself: its process groups give {told} = {product} "
                            f"ranks, its world size is {world}")
    if world > 1 and product == 1:
        evidence.append(f"no degree: {world} ranks, no named process group and no collective tells one")
    groups = {d: v for d, v in groups.items() if v}
    pg_dims = dict(zip(named.pg_name, named.dim))
    lay = TraceLayout(world=world, dp=deg["dp"], tp=deg["tp"], pp=deg["pp"], sharding="none", micro_batches=1,
                      schedule=None, groups=groups, source="trace", evidence=tuple(evidence), pg_dims=pg_dims)
    dims = coll_dims(g, lay, tokens)
    sharding, why = _sharding(run, colls, dims, tokens, fwd)
    mb, schedule, why_pp = (1, None, [])
    if lay.pp > 1:
        mb, schedule, why_pp = _pipeline_schedule(g, colls, dims, groups.get("pp", []))
    lay = TraceLayout(**{**lay.__dict__, "sharding": sharding, "micro_batches": mb, "schedule": schedule,
                         "evidence": lay.evidence + tuple(why + why_pp)})
    return _cross_check(run, lay) if cross_check else lay


def coll_dims(g, lay: TraceLayout, coll_act) -> np.ndarray:
    """One dimension per row of g.colls (module docstring, rule 3): "dp" | "tp" | "pp" | another dimension's name |
    "world". coll_act (op_facts): a send / recv carrying tokens that no group holds is a pipeline's when the layout
    has one."""
    colls = g.colls
    n = len(colls)
    out = np.full(n, "world", dtype=object)
    if not n:
        return out.astype(str)
    tok = np.zeros(n, bool) if coll_act is None or len(coll_act) != n else np.asarray(coll_act, bool)
    member = {}  # dim -> {rank: index of its group in that dimension}
    for d, gs in lay.groups.items():
        for i, rks in enumerate(gs):
            for r in rks:
                member.setdefault(d, {})[int(r)] = i
    by_ranks = {}
    for d in list(_MATCH_ORDER) + sorted(set(lay.groups) - set(_MATCH_ORDER)):
        for rks in lay.groups.get(d, []):
            by_ranks.setdefault(frozenset(int(r) for r in rks), d)
    p2p = colls.op.isin(P2P_OPS).to_numpy(bool)
    for i, (pg, rks) in enumerate(zip(colls.pg_name, colls.ranks)):
        rks = [int(r) for r in rks]
        if p2p[i]:
            # a send / recv moves between two ranks: the dimension whose one group holds both
            for d in ("pp",) + tuple(x for x in lay.groups if x != "pp"):
                m = member.get(d, {})
                if len(rks) == 2 and rks[0] in m and rks[1] in m and m[rks[0]] == m[rks[1]] and len(
                        lay.groups[d][m[rks[0]]]) > 1:
                    out[i] = d
                    break
            else:
                if tok[i] and lay.pp > 1:
                    out[i] = "pp"
            continue
        d = lay.pg_dims.get(str(pg)) if pg is not None and not pd.isna(pg) else None
        if d is not None:
            out[i] = d
            continue
        out[i] = by_ranks.get(frozenset(rks), "world")
    return out.astype(str)


# ----------------------------------------------------------------------------------------------- the named groups

def _world(run, g) -> int:
    rows = run.sql("SELECT rank, world_size FROM ranks")
    sizes = {int(w) for w in rows.world_size.dropna()}
    if len(sizes) > 1:
        raise TracekitError(f"[dims] the ranks disagree on the world size: {sorted(sizes)}")
    if sizes:
        return sizes.pop()
    ranks = {int(r) for r in rows["rank"].dropna()} | {int(r) for r in g.ranks}
    return max(1, len(ranks))


def _dim_of_desc(desc: str) -> tuple[str | None, bool]:
    """(dimension, whether the group's size is its degree) of a pg_desc; (None, False) for none."""
    if not isinstance(desc, str):
        return None, False
    if desc.startswith("mesh_"):
        name = desc[len("mesh_"):]
        if name in MESH_DIMS:
            return (name if name in _DP_SPLIT else MESH_DIMS[name]), True
        return (name if re.fullmatch(r"[a-z_]+", name) else None), False  # a flattened dimension: dp_shard_cp
    key = re.sub(r"_(GLOO|AG)$", "", desc.upper())
    if key in MEGATRON_GROUPS:
        return MEGATRON_GROUPS[key]
    return None, False


def _named_groups(run) -> pd.DataFrame:
    """The union of every rank's pg_config entries that name a dimension: pg_name, pg_desc, ranks (tuple), size,
    dim, sets_degree (False for sub-groups and copies), sub ('dp_shard' / 'dp_replicate' when DeviceMesh splits
    dp)."""
    rows, unnamed, pg_count = [], {}, 0
    for cfg, n in process_group_configs(run):
        pg_count = max(pg_count, n)
        for p in cfg if isinstance(cfg, list) else []:
            if not isinstance(p, dict) or not p.get("ranks"):
                continue
            dim, sets = _dim_of_desc(p.get("pg_desc"))
            if dim is None:
                if p.get("pg_desc") != "default_pg":
                    unnamed[(str(p.get("pg_name")), tuple(p["ranks"]))] = (str(p.get("pg_desc")), len(p["ranks"]))
                continue
            sub = dim if dim in _DP_SPLIT else None
            rows.append({"pg_name": str(p.get("pg_name")), "pg_desc": str(p.get("pg_desc")),
                         "ranks": tuple(int(r) for r in p["ranks"]), "size": len(p["ranks"]),
                         "dim": "dp" if sub else dim, "sets_degree": sets, "sub": sub})
    cols = ["pg_name", "pg_desc", "ranks", "size", "dim", "sets_degree", "sub"]
    df = pd.DataFrame(rows, columns=cols)
    df = df.drop_duplicates(["pg_name", "ranks"]).reset_index(drop=True) if rows else df
    if unnamed:
        descs = sorted({d for d, _ in unnamed.values()})
        sizes = sorted({n for _, n in unnamed.values()})
        df.attrs["unnamed"] = (f"{len(unnamed)} process group(s) besides default_pg in the traced ranks' "
                               f"distributedInfo (pg_count {pg_count}) name no dimension: pg_desc "
                               f"{', '.join(descs)}; sizes {', '.join(map(str, sizes))}")
    return df


def _named_degree(grp: pd.DataFrame) -> int | None:
    """A named dimension's degree: its degree-setting groups' largest size (dp_shard x dp_replicate when DeviceMesh
    splits dp and names no flattened dp); None when only sub-groups and copies name it."""
    own = grp[grp.sets_degree & grp["sub"].isna()]
    if len(own):
        return int(own["size"].max())
    split = grp[grp.sets_degree & grp["sub"].notna()]
    if len(split):
        return int(np.prod([int(s["size"].max()) for _, s in split.groupby("sub")]))
    return None


def _degree_groups(grp: pd.DataFrame) -> list[list[int]]:
    """A named dimension's groups: those that set its degree (the ranks DeviceMesh's dp_shard and dp_replicate
    groups join, when they split it); all of them when none does (a combined or sub-group name)."""
    own = grp[grp.sets_degree & grp["sub"].isna()]
    if len(own):
        n = own["size"].max()
        return sorted(list(r) for r in set(own.ranks[own["size"] == n]))
    split = grp[grp.sets_degree & grp["sub"].notna()]
    if not len(split):
        return sorted(list(r) for r in set(grp.ranks))
    comp = {}
    for rks in split.ranks:
        joined = set(rks).union(*[comp[r] for r in rks if r in comp])
        for r in joined:
            comp[r] = joined
    return sorted(list(c) for c in {tuple(sorted(c)) for c in comp.values()})


def _complement_groups(world: int, groups: dict, deg: dict) -> list[list[int]]:
    """dp's groups when no group names it: the ranks that share every other dimension's position (each rank's
    index in its group of each named dimension)."""
    pos = {r: [] for r in range(world)}
    for d in WORLD_DIMS:
        if d == "dp" or deg[d] <= 1:
            continue
        for gs in groups.get(d, []):
            for i, r in enumerate(gs):
                if r in pos:
                    pos[r].append((d, i))
    out = {}
    for r in range(world):
        out.setdefault(tuple(pos[r]), []).append(r)
    return sorted(out.values())


# ------------------------------------------------------------------------------------ what the collectives carry

_KERNEL_CALLS_SQL = """
WITH k AS (SELECT rank, event_id, correlation FROM events
           WHERE cat = 'kernel' AND correlation IS NOT NULL AND lower(name) LIKE 'nccl%'),
     l AS (SELECT rank, correlation, tid, ts_ns FROM events
           WHERE cat IN ('cuda_runtime', 'cuda_driver') AND correlation IS NOT NULL)
SELECT k.rank, k.event_id, c.input_dims
FROM k JOIN l USING (rank, correlation)
JOIN events c ON c.rank = l.rank AND c.tid = l.tid AND c.name = 'record_param_comms'
     AND c.ts_ns <= l.ts_ns AND c.ts_ns + c.dur_ns >= l.ts_ns
WHERE c.input_dims IS NOT NULL
"""
_PARAM_SHAPES_SQL = """
SELECT DISTINCT rank, json_extract(input_dims, '$[0]')::VARCHAR AS shape FROM events
WHERE ph = 'X' AND name = 'torch::autograd::AccumulateGrad' AND input_dims IS NOT NULL
"""


def _shapes(dims) -> list[tuple]:
    """The tensor shapes of an op's Input Dims (a TensorList's entries included)."""
    out = []
    for x in dims if isinstance(dims, list) else []:
        if isinstance(x, list) and x and all(isinstance(v, list) for v in x):
            out += [tuple(v) for v in x]
        elif isinstance(x, list) and all(isinstance(v, int) for v in x):
            out.append(tuple(x))
    return out


def _token_colls(run, g, coll_act) -> np.ndarray:
    """coll_act, and for the collectives whose participants are device kernels (op_facts matches CPU events only):
    whether the call that launched a participant holds a tensor of two or more dimensions that is no parameter's
    shape."""
    colls = g.colls
    tok = np.zeros(len(colls), bool)
    if coll_act is not None and len(coll_act) == len(colls):
        tok |= np.asarray(coll_act, bool)
    gpu = (colls.timeline == "gpu").to_numpy(bool) if len(colls) else np.zeros(0, bool)
    if not gpu.any():
        return tok
    calls = run.sql(_KERNEL_CALLS_SQL)
    if calls.empty:
        return tok
    params = run.sql(_PARAM_SHAPES_SQL)
    pshapes = {}
    for r, s in zip(params["rank"], params.shape):
        try:
            pshapes.setdefault(int(r), set()).add(tuple(json.loads(s)))
        except (TypeError, ValueError):
            continue
    carries = {}
    for r, e, dims in zip(calls["rank"], calls.event_id, calls.input_dims):
        try:
            shapes = _shapes(json.loads(dims))
        except ValueError:
            continue
        mine = pshapes.get(int(r), set())
        carries[(int(r), int(e))] = any(len(s) >= 2 and s not in mine for s in shapes)
    for i in np.flatnonzero(gpu & ~tok):
        tok[i] = any(carries.get((int(r), int(e)), False)
                     for r, e in zip(colls.present_ranks.iat[i], colls.events.iat[i]))
    return tok


def _in_forward(g) -> np.ndarray:
    """Per row of g.colls: its first participant arrived before that rank's first backward node of the step (a
    window without backward nodes is all forward)."""
    colls = g.colls
    n = len(colls)
    if not n:
        return np.zeros(0, bool)
    rank0 = np.array([int(r[0]) for r in colls.present_ranks], np.int64)
    t0 = np.array([int(a[0]) for a in colls.arrivals], np.int64)
    names = pd.Series(g.name, dtype=object)
    bwd = names.str.startswith(BACKWARD_PREFIX, na=False).to_numpy(bool) & (g.rank >= 0)
    out = np.ones(n, bool)
    for r in np.unique(rank0):
        sel = np.flatnonzero(rank0 == r)
        st = g.steps[g.steps["rank"] == r].sort_values("ts_ns")
        edges = st.ts_ns.to_numpy(np.int64)
        b = np.sort(g.start_ns[bwd & (g.rank == r)])
        if not len(b):
            continue
        # each collective's step window (or the whole trace), and the first backward node inside it
        step = np.searchsorted(edges, t0[sel], side="right") - 1 if len(edges) else np.zeros(len(sel), np.int64)
        lo = np.where(step >= 0, edges[np.maximum(step, 0)] if len(edges) else np.iinfo(np.int64).min,
                      np.iinfo(np.int64).min)
        first_b = b[np.minimum(np.searchsorted(b, lo, side="left"), len(b) - 1)]
        has_b = (first_b >= lo)
        if len(edges):
            ends = st.end_ns.to_numpy(np.int64)
            hi = np.where(step >= 0, ends[np.maximum(step, 0)], edges[0])
            has_b &= first_b < hi
        out[sel] = ~has_b | (t0[sel] < first_b)
    return out


def _kinds(colls: pd.DataFrame, tokens: np.ndarray, fwd: np.ndarray) -> np.ndarray:
    """Rule 2's kind of each collective: 'p2p' (a send / recv carrying tokens), 'token', 'gather' (an all-gather of
    non-token tensors in the forward), 'other'."""
    op = colls.op.astype(str).to_numpy()
    p2p = np.isin(op, P2P_OPS)
    gather = np.char.find(op.astype(str), "all_gather") >= 0 if len(op) else np.zeros(0, bool)
    return np.where(p2p & tokens, "p2p", np.where(tokens & ~p2p, "token",
                                                 np.where(gather & ~tokens & fwd, "gather", "other")))


def _unnamed(colls, tokens, fwd, world, deg, groups, evidence) -> None:
    """Rule 2 on a world that names no dimension but perhaps the pipeline: what the pipeline leaves (the whole
    world without one) is tp when collectives carry tokens, else dp."""
    rest = world // deg["pp"]
    if rest <= 1 or world % deg["pp"] or not len(colls):
        return
    kinds = _kinds(colls, tokens, fwd)
    n_tok, n_gather = int((kinds == "token").sum()), int((kinds == "gather").sum())
    where = "on the world's group" if deg["pp"] == 1 else f"beside the pipeline's {deg['pp']} stages"
    dim = "tp" if n_tok else "dp"
    deg[dim] = rest
    groups[dim] = [list(range(world))] if deg["pp"] == 1 else _complement_groups(world, groups, deg)
    if n_tok:
        ops = ", ".join(f"{n} {o}" for o, n in colls.op[kinds == "token"].value_counts().items())
        evidence.append(f"tp = {rest}: {ops} carrying the step's tokens {where} (tensor parallelism; no group is "
                        "named)")
    elif n_gather:
        evidence.append(f"dp = {rest}: {n_gather} all-gathers of non-token tensors in the forward {where} "
                        "(sharded parameters; no group is named)")
    else:
        ops = ", ".join(f"{n} {o}" for o, n in colls.op[kinds == "other"].value_counts().items())
        evidence.append(f"dp = {rest}: only collectives of non-token tensors ({ops}) {where} (data parallelism; "
                        "no group is named)")


# --------------------------------------------------------------------------------------------- sharding, pipeline

def _sharding(run, colls, dims, tokens, fwd) -> tuple[str, list[str]]:
    """Rule 4: 'fsdp' when the dp dimension all-gathers non-token tensors, some in the forward; 'replicate' when it
    does not, under FSDP2's pre-forward ranges."""
    if not len(colls):
        return "none", []
    gather = colls.op.astype(str).str.contains("all_gather").to_numpy(bool) & ~tokens & (dims == "dp")
    if not (gather & fwd).any():  # gathered before use: some in the forward (only in the backward is no sharding)
        if not (dims == "dp").any():
            return "none", []
        pre = run.sql("SELECT count(*) AS n FROM events WHERE ph = 'X' AND name = 'FSDP::pre_forward'").n.iat[0]
        if not pre:
            return "none", []
        return "replicate", [f"sharding replicate: data parallelism with no all-gather, {int(pre)} FSDP::pre_forward "
                             "ranges (FSDP2's replicate)"]
    ranges = run.sql("SELECT count(*) AS n FROM events WHERE ph = 'X' AND (name = 'FSDP::all_gather' "
                     "OR name LIKE 'FSDP::all_gather (%')").n.iat[0]
    n_fwd = int((gather & fwd).sum())
    why = (f"sharding fsdp: {int(gather.sum())} all-gathers of non-token tensors on dp ({n_fwd} in the forward)"
           + (f", inside {int(ranges)} FSDP::all_gather ranges" if ranges else ""))
    return "fsdp", [why]


def _pipeline_chains(g, tokens: np.ndarray) -> list[list[int]]:
    """The pipelines the sends / recvs link (when any carries tokens), each in stage order: the ranks the transfers
    join form a chain; its first stage is the end that most often sends before it receives in a step (the first
    stage's step opens with a forward send, the last stage's with the recv of activations)."""
    colls = g.colls
    if not len(colls):
        return []
    p2p = colls.op.isin(P2P_OPS).to_numpy(bool)
    if not (p2p & tokens).any():
        return []
    sel = colls[p2p]
    src = np.array([int(r[0]) for r in sel.ranks], np.int64)
    dst = np.array([int(r[1]) for r in sel.ranks], np.int64)
    adj: dict = {}
    for x, y in zip(src, dst):
        adj.setdefault(int(x), set()).add(int(y))
        adj.setdefault(int(y), set()).add(int(x))
    # each rank's own posting of its part, and whether it sent
    part = [(int(r), int(t), int(r) == int(s0))
            for p, a, s0 in zip(sel.present_ranks, sel.arrivals, src) for r, t in zip(p, a)]
    part = pd.DataFrame(part, columns=["rank", "t", "sent"]).sort_values("t", kind="stable")
    opens_with_send = {}
    for r, e in part.groupby("rank", sort=False):
        step = _step_of(g.steps, int(r), e.t.to_numpy(np.int64))
        first = e.assign(step=step)[step >= 0].groupby("step", sort=False).sent.first()
        opens_with_send[int(r)] = float(first.mean()) if len(first) else 0.0
    chains, seen = [], set()
    for r in sorted(adj):
        if r in seen:
            continue
        comp, todo = set(), [r]
        while todo:
            x = todo.pop()
            if x not in comp:
                comp.add(x)
                todo += list(adj[x] - comp)
        seen |= comp
        ends = [x for x in comp if len(adj[x]) == 1] or sorted(comp)
        start = max(sorted(ends), key=lambda x: opens_with_send.get(x, 0.0))
        chain = [start]
        while True:
            nxt = sorted(adj[chain[-1]] - set(chain))
            if not nxt:
                break
            chain.append(nxt[0])
        chains.append(chain)
    return sorted(chains)


def _step_of(steps: pd.DataFrame, rank: int, t: np.ndarray) -> np.ndarray:
    """The step of rank each time falls in (-1: none; 0 for every time when the rank has no steps)."""
    st = steps[steps["rank"] == rank].sort_values("ts_ns")
    if st.empty:
        return np.zeros(len(t), np.int64)
    i = np.searchsorted(st.ts_ns.to_numpy(np.int64), t, side="right") - 1
    inside = (i >= 0) & (t < st.end_ns.to_numpy(np.int64)[np.maximum(i, 0)])
    return np.where(inside, st.step.to_numpy(np.int64)[np.maximum(i, 0)], -1)


def _pipeline_schedule(g, colls, dims, chains) -> tuple[int, str | None, list[str]]:
    """Rule 5: micro-batches per step and the schedule."""
    if not chains or not len(colls):
        return 1, None, []
    pp = (dims == "pp") & colls.op.isin(P2P_OPS).to_numpy(bool)
    sel = colls[pp]
    src = np.array([int(r[0]) for r in sel.ranks], np.int64)
    dst = np.array([int(r[1]) for r in sel.ranks], np.int64)
    stage = {r: (ci, s) for ci, ch in enumerate(chains) for s, r in enumerate(ch)}
    s_src = np.array([stage.get(int(r), (-1, -1))[1] for r in src])
    s_dst = np.array([stage.get(int(r), (-1, -1))[1] for r in dst])
    forward = s_dst == s_src + 1
    backward = s_dst == s_src - 1
    done = (sel.barrier_start_ns + sel.measured_transfer_ns).to_numpy(np.int64)
    arrival = np.array([int(a[list(p).index(s)]) if s in p else int(a[0])
                        for a, p, s in zip(sel.arrivals, sel.present_ranks, src)], np.int64)
    steps = g.steps

    def step_of(rank: int, t: np.ndarray) -> np.ndarray:
        return _step_of(steps, rank, t)

    counts = []
    for ch in chains:
        first = ch[0]
        mine = forward & (src == first)
        s = step_of(first, arrival[mine])
        full = steps[(steps["rank"] == first) & ~steps.is_last.astype(bool)].step if len(steps) else pd.Series([0])
        c = pd.Series(s[s >= 0]).value_counts()
        counts += [int(c.get(x, 0)) for x in full] if len(steps) else [int(mine.sum())]
    counts = [c for c in counts if c > 0]
    mb = int(np.median(counts)) if counts else 1
    why = [(f"micro_batches = {mb}: the first stage's forward sends per step (median over {len(counts)} "
            f"step(s) of {len(chains)} pipeline(s))")]
    if mb <= 1 or not backward.any():
        why.append("schedule not tellable: " + ("one micro-batch" if mb <= 1 else "no backward transfers"))
        return mb, None, why
    interleaved, judged = [], 0
    for r in stage:
        on = np.flatnonzero((src == r) | (dst == r))
        if not len(on):
            continue
        # the step is the one the stage posted its part in; the order is the transfers' completion
        own = np.array([int(a[list(p).index(r)]) if r in p else -1
                        for a, p in zip(sel.arrivals.iloc[on], sel.present_ranks.iloc[on])], np.int64)
        s = step_of(r, own)
        t, f, b = done[on], forward[on], backward[on]
        for x in np.unique(s[s >= 0]):
            w = s == x
            if (w & f).any() and (w & b).any():
                judged += 1
                if t[w & b].min() < t[w & f].max():
                    interleaved.append(r)
                    break
    if not judged:
        why.append("schedule not tellable: no step holds both forward and backward transfers of a stage")
        return mb, None, why
    if interleaved:
        why.append(f"schedule 1f1b: stage rank(s) {sorted(set(interleaved))} receive or send gradients before "
                   "their last forward transfer of the step")
        return mb, "1f1b", why
    why.append("schedule gpipe: on every stage each step's gradient transfers complete after its last forward "
               "transfer")
    return mb, "gpipe", why


# ------------------------------------------------------------------------------------------------- the cross-check

def _cross_check(run, lay: TraceLayout) -> TraceLayout:
    """Rule 6: run.json's `parallel` block against the trace's figures."""
    from .parallelism import layout as run_layout

    par = run_layout(run)
    if par.get("source") != "run.json":
        return lay
    manifest = run.run_manifest().get("parallel") or {}
    theirs = {"dp": par["dp"], "tp": par["tp"], "pp": par["pp"], "micro_batches": par["micro_batches"]}
    if manifest.get("sharding") in SHARDING:
        theirs["sharding"] = manifest["sharding"]
    told = any(getattr(lay, d) > 1 for d in ("dp", "tp", "pp")) or lay.world == 1
    if not told:  # the trace tells no degree: the block gives them
        ev = lay.evidence + ("degrees from run.json's parallel block: the trace tells none",)
        return TraceLayout(world=lay.world, dp=theirs["dp"], tp=theirs["tp"], pp=theirs["pp"],
                           sharding=theirs.get("sharding", lay.sharding), micro_batches=theirs["micro_batches"],
                           schedule=lay.schedule, groups=lay.groups, source="run.json", evidence=ev,
                           pg_dims=lay.pg_dims)
    diff = [f"{k} {theirs[k]} (trace: {getattr(lay, k)})" for k in theirs if theirs[k] != getattr(lay, k)]
    if not diff:
        return lay
    note = "run.json's parallel block disagrees, the trace's figures kept: " + ", ".join(diff)
    return TraceLayout(**{**lay.__dict__, "evidence": lay.evidence + (note,)})
