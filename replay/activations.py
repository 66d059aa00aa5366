"""A pipeline stage's memory over its micro-batch schedule, from what a run's [memory] events show a micro-batch
keeping: what a re-layout (replay/relayout.py) predicts where the new layout runs its micro-batches otherwise than
the run (another pipeline depth, schedule or micro-batch count). A run's own activations, where it holds several
micro-batches or all the blocks, are not one stage's: a stage's are rebuilt from a micro-batch's.

The blocks a micro-batch's forward and backward allocate (memory_blocks' activations, other and communication
buffers; gradients, parameters and optimizer state are the stage's state), each placed by the rank's top-level
operator around its allocation (op_facts' phase; between two backward nodes with no forward block starting in
between is the backward's: a tensor subclass runs a checkpoint's recompute outside the nodes). Per token of a rank's
micro-batch (Structure.tokens):
- `block`: what one repeated forward block (memory._forward_blocks) allocates and still holds when its step's next
  backward starts, the median over the run's blocks and ranks; `pre`: the same of the forward's operators outside
  the blocks nearer the next block (the embedding's output), the first stage's; `post`: nearer the previous block
  (the head's output and the loss's saved tensors), the last stage's; each the median over its micro-batches;
- the transients on top, the most live at once: of what the forward allocates and frees before the backward (the
  loss's working set on the last stage), and of what the backward allocates (the gradients of activations, a
  checkpoint's recompute); the last stage's and the others' apart (a run without a pipeline shows no other stage:
  its backward's transient is taken for every stage, its forward's only for the last);
- the backward's fullest over what its micro-batches kept, net of what it has freed of that by then (`over_kept`:
  the head's logits and the loss's saved tensors are gone before a block's recompute peaks), per stretch of the
  backward between two forward blocks;
- a step's first backward until its gradients are made (`first_backward`): at each event, the share of the
  gradients made and its transient live (a backward's transient is largest at the loss, where it holds no gradients
  yet: at its end, the gradients full, it holds less).

Tensor parallelism splits a block's bytes and the transients (what it leaves: relayout's _tp_activations), not the
embedding's or the head's outputs, nor a checkpointed block's input (relayout's _kept_split). A stage's peak
(stage_peak, stage_peaks) walks its schedule (schedule: GPipe's forwards then backwards, 1F1B's warm-up forwards then
one forward and one backward, a stage without a pipeline its micro-batches one after the other): a forward adds a
micro-batch's kept bytes with the forward's transient on top; a backward holds its fullest over them (over_kept),
then frees the micro-batch; the gradients fill during the first backward, freeing the micro-batch as they fill (its
blocks' bytes by the share of the gradients made, a block's backward freeing what it kept as it makes its
gradients; the head's once the loss's backward has run), the transient on top: the most of them at once over the
run's first backward (first_backward), on the new stage's bytes. The gradients stay for the step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analyses import depgraph as _graph

from .memory import BACKWARD, FORWARD, OpFacts, _forward_blocks, _memory_analysis


@dataclass
class Kept:
    """Bytes per token of a micro-batch (module docstring); tokens: the tokens they are per."""
    block: float = 0.0  # one block keeps for the backward
    pre: float = 0.0  # kept before the first block (the first stage's)
    post: float = 0.0  # kept after the last block (the last stage's)
    forward_last: float = 0.0  # the forward's transient on the last stage (the loss)
    forward_rest: float = 0.0  # ... on another stage
    backward_last: float = 0.0  # the backward's transient on the last stage
    backward_rest: float = 0.0
    # the backward's fullest over what its micro-batch keeps, net of what it frees of that by then (the head's
    # logits and the loss's saved tensors are freed before a block's recompute peaks): <= the transient
    over_kept_last: float = 0.0
    over_kept_rest: float = 0.0
    tokens: int = 0
    # a step's first backward, at each of its events: (the share of the gradients it has made, its transient per
    # token) -- where a backward peaks as the gradients fill (_Placed.first_backward); None: the run shows none
    first_backward_last: np.ndarray | None = field(default=None, repr=False)
    first_backward_rest: np.ndarray | None = field(default=None, repr=False)

    def micro_batch(self, blocks: float, first: bool, last: bool, tp_factor: float = 1.0) -> float:
        """What a micro-batch keeps per token on a stage of `blocks` blocks; tp_factor: what tensor parallelism
        leaves of a block's (the embedding's and the head's outputs are not split)."""
        return blocks * self.block * tp_factor + (self.pre if first else 0.0) + (self.post if last else 0.0)


def schedule(pp: int, stage: int, micro_batches: int, kind: str) -> list[str]:
    """A stage's forwards ("F") and backwards ("B") in order: GPipe's all forwards first; 1F1B's pp - stage - 1
    warm-up forwards, then a forward and a backward, then the rest of the backwards (torch.distributed.pipelining's
    Schedule1F1B); without a pipeline, each micro-batch's forward and backward in turn."""
    m = max(int(micro_batches), 1)
    if pp <= 1:
        return ["F", "B"] * m
    if kind == "gpipe":
        return ["F"] * m + ["B"] * m
    warm = min(pp - stage - 1, m)
    return ["F"] * warm + ["F", "B"] * (m - warm) + ["B"] * warm


def stage_peak(ops: list[str], kept_bytes: float, forward_top: float, backward_top: float, grads: float,
               over_kept: float | None = None, retained: float = 0.0) -> float:
    """The largest of a stage's activations, transients and gradients over its schedule (module docstring):
    kept_bytes a micro-batch keeps, forward_top / backward_top the transients on top, grads the stage's gradients;
    over_kept: the backward's fullest over its micro-batch's kept bytes, net of what it has freed of them (Kept;
    default: backward_top, nothing freed); retained: of kept_bytes, what a micro-batch holds after its backward
    until the step ends (the model's output)."""
    return max(stage_peaks(ops, kept_bytes, forward_top, backward_top, grads, over_kept, retained))


def stage_peaks(ops: list[str], kept_bytes: float, forward_top: float, backward_top: float, grads: float,
                over_kept: float | None = None, retained: float = 0.0,
                head: float = 0.0, first_backward: np.ndarray | None = None) -> tuple[float, float, float]:
    """stage_peak's largest (its arguments) apart: (at a forward's end or a backward's start -- on the last stage
    the loss and its backward --, in a backward once the head's bytes of its micro-batch are freed (head: of
    kept_bytes, the last stage's after its blocks; what it retains stays), in the first backward as the gradients
    fill). first_backward: a run's first backward (Kept.first_backward_*, its transient in bytes here), at each event
    from its first gradient the gradients' share made and the transient live; there the micro-batch holds what it
    retains and its blocks' and embedding's bytes less that share (each block's backward frees what it kept as it
    makes its gradients; the loss's backward has freed the head's), and the first backward holds the most of their
    sum. Without it, its end: its micro-batch freed but what it retains, the gradients full and the backward's
    transient on top."""
    over = backward_top if over_kept is None else over_kept
    freed = max(head - retained, 0.0)
    if first_backward is not None and len(first_backward):
        made, live_tr = np.asarray(first_backward, np.float64).T
        fill = float(np.max(max(kept_bytes - max(head, retained), 0.0) * (1.0 - made) + grads * made + live_tr))
    else:
        fill = grads + backward_top
    live, held, kept_after, ends, blocks, first_end = 0, 0.0, 0.0, 0.0, 0.0, 0.0
    for op in ops:
        if op == "F":
            live += 1
            ends = max(ends, live * kept_bytes + forward_top + held + kept_after)
            continue
        ends = max(ends, live * kept_bytes + over + held + kept_after)
        blocks = max(blocks, live * kept_bytes - freed + over + held + kept_after)
        if not held:  # the first backward: its micro-batch's bytes freed as the gradients fill
            first_end = max(first_end, (live - 1) * kept_bytes + retained + fill + kept_after)
        live = max(live - 1, 0)
        held = grads
        kept_after += retained
    return ends, blocks, first_end


def measure(run, g, facts: OpFacts, tokens: int, devices: dict, stages: dict, pp: int,
            cache: dict) -> tuple[Kept | None, dict]:
    """(the job's Kept, module docstring; per device, the bytes of its activations the forward does not keep for the
    backward -- the forward's temporaries and what the backward allocates, a checkpoint's recompute -- live at each
    of its times). devices: (rank, device type, device id) of the ranks whose peaks are judged -> the times (their
    [memory] events'); stages: rank -> its pipeline stage of pp (none without a pipeline). A block's bytes are the
    median of the ranks', the embedding's the first stage's largest, the head's and the transients the last stage's
    (and the others' apart). Kept is None where no rank shows a repeated block keeping activations. Each rank's
    allocations are placed once (_Placed) for both."""
    blocks = _memory_analysis(run, cache, "memory_blocks")
    got, unkept, curves = {}, {}, {}
    for (r, dt, di), times in devices.items():
        mine = blocks[(blocks["rank"] == r) & (blocks.device_type == dt) & (blocks.device_id == di)]
        placed = _Placed.of(g, facts, r, mine[mine.category.isin(WORKING)])
        unkept[(r, dt, di)] = placed.unkept_activations(times)
        x = placed.kept() if tokens > 0 and facts.blocks else None
        if x is not None:
            got[r] = np.array(x) / tokens
            curves[r] = placed.first_backward(mine[mine.category == "gradients"]) / [1.0, tokens]
    if not got:
        return None, unkept
    last = {r for r in got if stages.get(r, pp - 1) == pp - 1}
    first = {r for r in got if stages.get(r, 0) == 0}

    def most(ranks, i):
        return max((float(got[r][i]) for r in ranks), default=0.0)

    def curve(ranks):  # None where the ranks' first backwards make no gradients
        c = np.concatenate([curves[r] for r in ranks]) if ranks else np.zeros((0, 2))
        return c if len(c) else None

    rest = set(got) - last
    return Kept(float(np.median([x[0] for x in got.values()])), most(first, 1), most(last, 2),
                forward_last=most(last, 3), forward_rest=most(rest, 3), backward_last=most(last, 4),
                # no other stage: the backward's transient is every stage's, the forward's (the loss) the last's
                backward_rest=most(rest, 4) if rest else most(last, 4), over_kept_last=most(last, 5),
                over_kept_rest=most(rest, 5) if rest else most(last, 5), tokens=tokens,
                first_backward_last=curve(last), first_backward_rest=curve(rest) if rest else curve(last)), unkept


# the categories a micro-batch's forward and backward allocate (what they keep and their transients); gradients,
# parameters and optimizer state are the stage's state
WORKING = ("activations", "other", "communication_buffers")


def _phase_at(g, facts: OpFacts, rank: int, ts: np.ndarray) -> np.ndarray:
    """The phase (memory.FORWARD, BACKWARD, ...) of the rank's top-level operator holding each time; 0 outside."""
    nodes = np.flatnonzero((g.rank == rank) & (g.kind == _graph.K["cpu"]))
    nodes = nodes[np.argsort(g.start_ns[nodes], kind="stable")]
    at = np.searchsorted(g.start_ns[nodes], ts, side="right") - 1
    ok = at >= 0
    ok[ok] &= ts[ok] < (g.start_ns[nodes] + g.dur_ns[nodes])[at[ok]]
    phase = np.zeros(len(ts), np.int8)
    phase[ok] = facts.phase[nodes[at[ok]]]
    return phase


def _live(ts: np.ndarray, end: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the times, sorted, the bytes live after each) of blocks allocated at ts and ended at end (inf: never)."""
    t = np.concatenate([ts.astype(np.float64), end])
    d = np.concatenate([nbytes, -nbytes])
    order = np.lexsort((d, t))  # a free before an allocation at the same time
    return t[order], np.cumsum(d[order])


def _live_at(t: np.ndarray, live: np.ndarray, when: np.ndarray) -> np.ndarray:
    """The bytes live (_live's t and live) after the events up to each of when; 0 before the first."""
    i = np.searchsorted(t, when, side="right") - 1
    return np.where(i >= 0, live[np.clip(i, 0, None)], 0.0)


def _most_live(ts: np.ndarray, end: np.ndarray, nbytes: np.ndarray) -> float:
    """The most bytes live at once of blocks allocated at ts and ended at end (inf: never)."""
    return float(_live(ts, end, nbytes)[1].max(initial=0.0))


@dataclass
class _Placed:
    """One rank's allocations (memory_blocks' rows of one device, WORKING categories) placed against its forward
    blocks and its backward: each one's phase (its top-level operator's, and the backward's between two backward
    nodes with no forward block starting in between: a checkpoint's recompute that a tensor subclass runs outside
    the nodes), whether its step's backward follows it in the forward (fwd) and whether it is still live when that
    backward starts (keeps: kept for it)."""
    starts: np.ndarray  # the forward blocks' starts and ends (memory._forward_blocks), over all steps
    ends: np.ndarray
    ts: np.ndarray  # each allocation's time, end (inf: never), bytes and category
    end: np.ndarray
    nbytes: np.ndarray
    category: np.ndarray
    phase: np.ndarray
    fwd: np.ndarray
    keeps: np.ndarray
    # the rank's steps' starts and ends (none: one step, the whole trace), its backward nodes' ends (sorted)
    step_ts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    step_end: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    bwd_ends: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @classmethod
    def of(cls, g, facts: OpFacts, rank: int, blocks: pd.DataFrame) -> "_Placed":
        spans = [x for step in _forward_blocks(g, facts, rank) for x in step]
        starts = np.array([a for a, _ in spans], np.int64)
        ends = np.array([b for _, b in spans], np.int64)
        ts = blocks.alloc_ts_ns.to_numpy(np.int64)
        end = blocks.end_ts_ns.to_numpy(dtype="float64", na_value=np.inf)
        nodes = (g.rank == rank) & (facts.phase == BACKWARD)
        bwd_starts = np.sort(g.start_ns[nodes])
        phase = _phase_at(g, facts, rank, ts)
        nb = np.searchsorted(bwd_starts, ts, side="right")
        if len(bwd_starts):
            inside = (nb > 0) & (nb < len(bwd_starts))
            lo = np.searchsorted(starts, bwd_starts[np.clip(nb - 1, 0, None)], side="left")
            hi = np.searchsorted(starts, bwd_starts[np.clip(nb, 0, len(bwd_starts) - 1)], side="left")
            phase[(phase == FORWARD) & inside & (lo == hi)] = BACKWARD
        steps = g.steps[g.steps["rank"] == rank].sort_values("ts_ns")
        step_end = steps.end_ns.to_numpy(np.int64)[np.clip(np.searchsorted(steps.ts_ns.to_numpy(np.int64), ts,
                                                                            side="right") - 1, 0, None)]
        fwd = (phase == FORWARD) & (nb < len(bwd_starts))
        fwd[fwd] &= bwd_starts[nb[fwd]] < step_end[fwd]
        keeps = fwd.copy()
        keeps[keeps] &= end[keeps] > bwd_starts[nb[keeps]]
        return cls(starts, ends, ts, end, blocks.bytes.to_numpy(np.float64), blocks.category.to_numpy(object), phase,
                   fwd, keeps, steps.ts_ns.to_numpy(np.int64), steps.end_ns.to_numpy(np.int64),
                   np.sort(g.start_ns[nodes] + g.dur_ns[nodes]))

    def first_backward(self, grads: pd.DataFrame) -> np.ndarray:
        """Each step's first backward (its first stretch of backward allocations, to its last backward node's end
        before the next forward block) until its gradients are made: the first event where the gradient bytes live
        (grads: the rank's memory_blocks rows of gradients), less those live when it starts, reach the highest level
        they then hold to the stretch's end (a later micro-batch's backward in the stretch only adds transients on
        top; the optimizer, after it, frees them). At each event from its first gradient on (before it, the loss's
        backward is a backward's start: stage_peaks' own): (the share of those gradients made, the bytes live of what
        it allocated). Rows of all steps; none where a step's stretch makes no gradients."""
        bwd = self.phase == BACKWARD
        if not bwd.any() or not len(grads):
            return np.zeros((0, 2))
        g_ts = grads.alloc_ts_ns.to_numpy(np.float64)
        g_end = grads.end_ts_ns.to_numpy(dtype="float64", na_value=np.inf)
        g_t, g_live = _live(g_ts, g_end, grads.bytes.to_numpy(np.float64))
        bounds = zip(self.step_ts, self.step_end) if len(self.step_ts) else [(-np.inf, np.inf)]
        stretch = np.searchsorted(self.starts, self.ts, side="right")  # the forward blocks started before
        out = []
        for s0, s1 in bounds:
            mine = bwd & (self.ts >= s0) & (self.ts < s1)
            if not mine.any():
                continue
            k0 = int(stretch[mine].min())
            mine &= stretch == k0
            t0 = float(self.ts[mine].min())
            t1 = min(float(self.starts[k0]) if k0 < len(self.starts) else np.inf, float(s1))
            nodes = self.bwd_ends[(self.bwd_ends > t0) & (self.bwd_ends < t1)]
            if len(nodes):
                t1 = float(nodes[-1]) + 1.0
            t = np.unique(np.concatenate([self.ts[mine], self.end[mine], g_ts, g_end]))
            t = t[(t >= t0) & (t < t1)]

            made = _live_at(g_t, g_live, t) - float(_live_at(g_t, g_live, np.array([t0 - 1]))[0])
            # what they hold from each event to the stretch's end: a later micro-batch's transients aside
            full = float(np.minimum.accumulate(made[::-1]).max()) if len(made) else 0.0
            if full <= 0:
                continue
            cut = int(np.argmax(made >= full))  # the gradients made: the micro-batch's backward is over
            t, made = t[:cut + 1], made[:cut + 1]
            a_t, a_live = _live(self.ts[mine], self.end[mine], self.nbytes[mine])
            filling = made > 0  # its start, the loss's backward before any gradient, is a backward's start
            out.append(np.column_stack([made / full, _live_at(a_t, a_live, t)])[filling])
        return np.concatenate(out) if out else np.zeros((0, 2))

    def unkept_activations(self, times: np.ndarray) -> np.ndarray:
        """Bytes of activations not kept for the backward live at each of times."""
        mine = (self.category == "activations") & ~self.keeps
        born_at, nbytes, end = self.ts[mine].astype(np.float64), self.nbytes[mine], self.end[mine]
        b, d = np.argsort(born_at, kind="stable"), np.argsort(end, kind="stable")
        born = np.concatenate([[0.0], np.cumsum(nbytes[b])])
        died = np.concatenate([[0.0], np.cumsum(nbytes[d])])
        t = np.asarray(times, np.float64)
        return born[np.searchsorted(born_at[b], t, side="right")] - died[np.searchsorted(end[d], t, side="right")]

    def kept(self):
        """(block, pre, post, forward transient, backward transient, backward over kept) bytes of one micro-batch
        (module docstring, _over_kept), or None where the forward shows no repeated block keeping bytes."""
        starts, ends, ts, nbytes = self.starts, self.ends, self.ts, self.nbytes
        if not len(starts):
            return None
        span = np.searchsorted(starts, ts, side="right") - 1  # the last block that started before
        in_block = self.keeps & (span >= 0) & (ts < ends[np.clip(span, 0, None)])
        if not in_block.any():
            return None
        block = float(np.median(np.bincount(span[in_block], weights=nbytes[in_block], minlength=len(starts))))
        # around the blocks: an allocation between two blocks goes with the nearer
        out = self.keeps & ~in_block
        nxt = span + 1
        gap_prev = np.where(span >= 0, ts - ends[np.clip(span, 0, None)], np.inf)
        gap_next = np.where(nxt < len(starts), starts[np.clip(nxt, 0, len(starts) - 1)] - ts, np.inf)
        is_pre = out & (gap_next < gap_prev)
        is_post = out & ~is_pre
        # the transients: what the forward allocates and frees before the backward, what the backward allocates
        tmp = self.fwd & ~self.keeps
        bwd = self.phase == BACKWARD
        return (block, _median_per(nxt[is_pre], nbytes[is_pre]), _median_per(span[is_post], nbytes[is_post]),
                _most_live(ts[tmp], self.end[tmp], nbytes[tmp]), _most_live(ts[bwd], self.end[bwd], nbytes[bwd]),
                self._over_kept(bwd))

    def _over_kept(self, bwd: np.ndarray) -> float:
        """The most, over the rank's backward stretches (its backward allocations between two forward blocks), of
        the bytes live of what the backward allocates and of what the forward kept, over those kept when the stretch
        begins: the backward's fullest over its micro-batches' kept bytes, net of what it has freed of them (the
        micro-batches it does not run are held throughout). 0 without a backward."""
        if not bwd.any():
            return 0.0
        on = bwd | self.keeps
        t, live = _live(self.ts[on], self.end[on], self.nbytes[on])
        b_ts = self.ts[bwd]
        stretch = np.searchsorted(self.starts, b_ts, side="right")  # the forward blocks started before it
        best = 0.0
        for k in np.unique(stretch):
            t0 = float(b_ts[stretch == k].min())
            t1 = float(self.starts[k]) if k < len(self.starts) else np.inf
            i0, i1 = np.searchsorted(t, t0, side="left"), np.searchsorted(t, t1, side="left")
            if i1 <= i0:
                continue
            before = live[i0 - 1] if i0 > 0 else 0.0
            best = max(best, float(live[i0:i1].max()) - before)
        return best


def _median_per(key: np.ndarray, nbytes: np.ndarray) -> float:
    """The median over the keys (the block a micro-batch's pre or post goes with) of their bytes; 0 without any."""
    if not len(key):
        return 0.0
    _, inv = np.unique(key, return_inverse=True)
    return float(np.median(np.bincount(inv, weights=nbytes)))
