"""The graph of each parallel layout's communication pattern, on tiny gloo traces built in code, with exact
times: a caller blocked in wait_tensor (DTensor, functional collectives), FSDP's all-gathers (one prefetched
behind compute) and its reduce-scatter that gloo runs as an all-reduce, a pipeline's send and recv (posted,
then waited for), two process groups told apart by the flight recorder, and a one-rank group. Each replays
its run exactly, and under "every link twice as fast" gives the step worked out by hand (transfers of one
kind of link and no latency: the transfers halve, the waits follow them, the compute stays)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import replay
import tracekit
from analyses import depgraph as G
from replay.scenario import scenario_from_dict

from .conftest import write_trace

MAIN, LOOP1, LOOP2 = 1, 2, 3
US = 1000  # ns


class Rank:
    """Events of one gloo rank, times in microseconds as Kineto writes them."""

    def __init__(self, rank: int, t0_us: float = 0.0):
        self.rank, self.ev, self.ext, self.t0 = rank, [], 0, t0_us  # t0_us: the clock's origin (a real trace's ~1.8e15)
        for tid, name in ((MAIN, "python"), (LOOP1, "pt_gloo_runloop"), (LOOP2, "pt_gloo_runloop")):
            self.ev.append({"ph": "M", "name": "thread_name", "pid": 100 + rank, "tid": tid,
                            "args": {"name": f"thread {tid} ({name})"}})

    def _x(self, cat, name, ts, end, tid, args):
        self.ext += 1
        self.ev.append({"ph": "X", "cat": cat, "name": name, "pid": 100 + self.rank, "tid": tid, "ts": self.t0 + ts,
                        "dur": float(end - ts), "args": {"External id": self.ext, **args}})
        return self

    def op(self, name, ts, end, dims=None, types=None, concrete=None, tid=MAIN):
        args = {}
        if dims is not None:
            args["Input Dims"] = dims
            args["Input type"] = types or ["float"] * len(dims)
        if concrete is not None:
            args["Concrete Inputs"] = concrete
        return self._x("cpu_op", name, ts, end, tid, args)

    def ann(self, name, ts, end, tid, dims=None):
        return self._x("user_annotation", name, ts, end, tid,
                       {"Input Dims": dims, "Input type": ["float"]} if dims is not None else {})

    def step(self, k, ts, end):
        return self._x("user_annotation", f"ProfilerStep#{k}", ts, end, MAIN, {})


def _open(tmp_path, ranks: list[Rank], pg_config=None, fr: dict | None = None):
    d = tmp_path / "run"
    world = len(ranks)
    groups = pg_config or [{"pg_name": "0", "pg_desc": "default_pg", "ranks": list(range(world))}]
    for r in ranks:
        mine = [g for g in groups if r.rank in g["ranks"]]
        write_trace(d / f"rank{r.rank}.trace.json", r.ev, rank=r.rank, world_size=world, pg_config=mine,
                    extra={"host_name": f"host{r.rank}"})
    for rank, entries in (fr or {}).items():
        (d / f"rank{rank}.fr.json").write_text(json.dumps({"version": "2.9", "pg_config": {}, "pg_status": {},
                                                            "entries": entries}))
    return tracekit.open(str(d), store=str(tmp_path / "store"))


def _steps_us(res) -> list[float]:
    s = res.summary()
    return [v / US for v in s.predicted_step_ns]


def _twice(model: str):
    return scenario_from_dict({"network": {"bandwidth_scale": 2.0, "model": model}}, "links2x")


MODELS = ("links", "alpha_beta")


def _exact_baseline(run):
    res = replay.run(run)
    s = res.summary()
    assert (s.measured_step_ns == s.predicted_step_ns).all()
    return res


# ---- a caller blocked in wait_tensor (DTensor's all-reduce: functional collectives)

def _tp(tmp_path):
    ranks = []
    for r in (0, 1):
        k = Rank(r).step(1, 0, 500).op("aten::mm", 0, 100)
        k.op("_c10d_functional::all_reduce", 100, 110, dims=[[256, 256], [], []], types=["float", "", ""])
        k.op("c10d::allreduce_", 102, 108, dims=[[[256, 256]], [], [], [], [], []],
             types=["TensorList", "", "", "", "Scalar", "Scalar"])
        k.ann("gloo:all_reduce", 105, 405, LOOP1, dims=[[256, 256]])
        k.op("_c10d_functional::wait_tensor", 120, 410, dims=[[256, 256]])
        k.op("aten::add", 410, 500)
        ranks.append(k)
    return _open(tmp_path, ranks)


def test_a_caller_blocked_in_wait_tensor_waits_on_the_transfer_not_on_cpu(tmp_path):
    run = _tp(tmp_path)
    g = _exact_baseline(run).graph
    assert len(g.colls) == 1 and g.colls.op[0] == "all_reduce" and int(g.colls.bytes[0]) == 256 * 256 * 4
    # the wait is no piece of CPU work: the op after it hangs off the collective's end
    hw = g.edge_kind == G.E["host_wait"]
    assert sorted(g.name[g.dst[hw]]) == ["aten::add", "aten::add"]
    assert not any(n == "_c10d_functional::wait_tensor" for n in g.name[g.kind == G.K["cpu"]])
    for model in MODELS:
        # transfer 300 -> 150 us from the last arrival at 105; the caller wakes 5 us after; aten::add takes 90
        assert _steps_us(replay.run(run, _twice(model))) == [350.0, 350.0], model


# ---- a caller blocked longer than the runloop's lead (DDP's last bucket on a busy machine)

def test_a_caller_woken_from_a_long_wait_well_before_the_runloop_ends_wakes_from_the_transfer(tmp_path):
    # the caller computes until 16000 us while the all-reduce moves, sits idle until 24000 and wakes there (the
    # all-reduce is done); the runloop's annotation ends 6 ms later (a worker descheduled); the caller copies until
    # 24350, idles 850 us and goes on. The wake-up is the long wait's end, not the short gap's nearer the
    # annotation's end: the transfer is 105 -> 24000
    ranks = []
    for r in (0, 1):
        k = Rank(r).step(1, 0, 30100).op("aten::mm", 0, 100)
        k.op("c10d::allreduce_", 100, 110, dims=[[[256, 256]], [], [], [], [], []],
             types=["TensorList", "", "", "", "Scalar", "Scalar"])
        k.ann("gloo:all_reduce", 105, 30000, LOOP1, dims=[[256, 256]])
        k.op("aten::mm", 110, 16000)
        k.op("aten::copy_", 24000, 24350)
        k.op("aten::add", 25200, 25700)
        ranks.append(k)
    run = _open(tmp_path, ranks)
    g = _exact_baseline(run).graph
    assert int(g.colls.measured_transfer_ns[0]) == (24000 - 105) * US
    hw = g.edge_kind == G.E["host_wait"]
    assert sorted(g.name[g.dst[hw]]) == ["aten::copy_", "aten::copy_"]
    # links 2x: the transfer 23895 -> 11947.5 us, hidden behind the compute until 16000: each caller's copy starts
    # as soon as the compute ends, 8 ms earlier
    for model in MODELS:
        base, fast = replay.run(run), replay.run(run, _twice(model))
        assert all(f < b for f, b in zip(_steps_us(fast), _steps_us(base))), model


# ---- FSDP: an all-gather waited for in its region, one prefetched behind compute, a reduce-scatter

def _fsdp(tmp_path):
    ranks = []
    for r in (0, 1):
        k = Rank(r).step(1, 0, 1400)
        k.ann("FSDP::all_gather", 0, 320, MAIN)
        k.op("c10d::_allgather_base_", 10, 20, dims=[[131072], [65536], [], [], []], types=["float", "float", "", "", ""])
        k.ann("gloo:all_gather", 15, 315, LOOP1, dims=[[65536]])
        k.op("aten::mm", 320, 420)
        k.op("c10d::_allgather_base_", 420, 430, dims=[[131072], [65536], [], [], []],
             types=["float", "float", "", "", ""])  # the next block's, prefetched
        k.ann("gloo:all_gather", 425, 725, LOOP1, dims=[[65536]])
        k.op("aten::mm", 430, 690)  # compute while it moves, then waits for the rest
        k.op("c10d::_reduce_scatter_base_", 730, 740, dims=[[65536], [131072], [], [], [], []],
             types=["float", "float", "", "", "", ""])
        k.ann("gloo:all_reduce", 735, 1335, LOOP2, dims=[[131072]])  # gloo reduce-scatters by an all-reduce
        k.op("aten::add", 1340, 1400)
        ranks.append(k)
    return _open(tmp_path, ranks)


def test_fsdp_all_gathers_and_the_reduce_scatter_gloo_runs_as_an_all_reduce(tmp_path):
    run = _fsdp(tmp_path)
    g = _exact_baseline(run).graph
    c = g.colls.sort_values("first_arrival_ns")
    # the reduce-scatter call pairs with the gloo:all_reduce its runloop ran (paired by the buffer, not the op),
    # and is costed as what went over the network: an all-reduce of the whole 512 KiB input
    assert c.op.tolist() == ["all_gather", "all_gather", "all_reduce"]
    assert c.bytes.astype(int).tolist() == [524288] * 3
    assert (c.measured_transfer_ns // US).tolist() == [300, 300, 600]
    assert (g.edge_kind == G.E["host_wait"]).sum() == 6  # each rank wakes from each of the three
    for model in MODELS:
        # AG1 ends at 15 + 150; wake +5; mm 100 -> 270. AG2 from 275 ends at 425 while mm runs 280..540: hidden.
        # The reduce-scatter's call at 540, its all-reduce from 545 takes 300 -> 845; wake +5; add 60 -> 910.
        assert _steps_us(replay.run(run, _twice(model))) == [910.0, 910.0], model


# ---- a pipeline's send and recv: posted by the call, waited for later; both directions

_P2P_ARGS = dict(dims=[[[64, 128]], [], [], []], types=["TensorList", "", "Scalar", "Scalar"])


def _post(rank: Rank, op: str, peer: int, ts: float, ann_end: float) -> Rank:
    """A send or recv of 64 x 128 floats with `peer`, posted by a 5 us call at ts: the gloo annotation that times
    it runs from ts + 1 to ann_end on the caller's thread."""
    call = "c10d::send" if op == "send" else "c10d::recv_"
    return rank.op(call, ts, ts + 5, concrete=["", "", str(peer), "0"], **_P2P_ARGS).ann(
        f"gloo:{op}", ts + 1, ann_end, MAIN, dims=[[64, 128]])


def _p2p(tmp_path, t0_us: float = 0.0):
    r0 = Rank(0, t0_us).step(1, 0, 1100).op("aten::mm", 0, 100)
    _post(r0, "send", 1, 100, 150)
    _post(r0, "recv", 1, 110, 1000)
    r0.op("aten::mm", 1005, 1100)  # woke 5 us after the gradient arrived
    r1 = Rank(1, t0_us).step(1, 0, 1000)
    _post(r1, "recv", 0, 50, 400)
    r1.op("aten::mm", 405, 700)
    _post(r1, "send", 0, 700, 720)
    r1.op("aten::mm", 705, 1000)
    return _open(tmp_path, [r0, r1])


def test_a_send_and_its_recv_tie_their_two_ends_and_the_receiver_waits_on_the_message(tmp_path):
    run = _p2p(tmp_path)
    g = _exact_baseline(run).graph
    c = g.colls.sort_values("first_arrival_ns")
    assert c.op.isin(["send", "recv"]).all() and c.ranks.tolist() == [[0, 1], [1, 0]]  # [sender, receiver]
    # the transfer runs from both ends posted (the later call's start: the receiver's ready notice leaves during its
    # call, before the annotation opens) to the message's arrival
    assert (c.measured_transfer_ns // US).tolist() == [300, 300]
    # the participants sit on no thread: the caller ran on after posting; the receivers wake on the message
    comm = g.kind == G.K["comm"]
    assert (g.track[comm] == -1).all()
    assert (g.edge_kind == G.E["host_wait"]).sum() == 2
    for model in MODELS:
        # 0 -> 1 from 100: 150 -> 250; rank 1 wakes at 255, computes 295, posts its send at 550 and computes 295
        # more: 850. The gradient arrives at 700; rank 0 wakes at 705, computes 95: 800.
        assert _steps_us(replay.run(run, _twice(model))) == [800.0, 850.0], model


def test_a_recv_that_ends_with_its_transfer_is_not_done_before_it_at_a_real_traces_clock(tmp_path):
    # a real trace's times are ~1.8e18 ns, which floats hold to 256 ns: a recv ending with its message's arrival
    # read as done before it, was held to its measured time, and a faster link left the pipeline's step as it was
    run = _p2p(tmp_path, t0_us=1_796_491_767_480_471.0)
    g = _exact_baseline(run).graph
    c = g.colls
    assert not any(early[list(present).index(ranks[1])]  # the receiver's (ranks: [sender, receiver])
                   for early, present, ranks in zip(c.early, c.present_ranks, c.ranks))
    assert _steps_us(replay.run(run, _twice("links"))) == pytest.approx([800.0, 850.0], abs=0.01)  # the clock's ns


def _exchange(r0: Rank, r1: Rank, t: float, grad_us: float, act_us: float = 200) -> None:
    """1F1B's steady state from t: rank 0 posts the next activation's send and the gradient's recv; rank 1 sends the
    gradient back at t + 600 (grad_us on the link) and then posts its recv of the activation, which gloo sends once
    rank 1's ready notice has come, and that notice is written into the pair's stream behind the gradient's bytes
    (the activation: act_us once the gradient has arrived)."""
    grad_end = t + 600 + grad_us
    _post(r0, "send", 1, t, grad_end + act_us)
    _post(r0, "recv", 1, t + 10, grad_end)
    _post(r1, "send", 0, t + 600, t + 603)
    _post(r1, "recv", 0, t + 605, grad_end + act_us)


def _behind_the_other_way(tmp_path):
    r0 = Rank(0).step(1, 0, 1200).op("aten::mm", 0, 100)
    r1 = Rank(1).step(1, 0, 1300).op("aten::mm", 0, 700)
    _exchange(r0, r1, 100, 200)
    r0.op("aten::mm", 905, 1200)  # woke 5 us after the gradient arrived
    r1.op("aten::mm", 1105, 1300)
    return _open(tmp_path, [r0, r1])


def _behind_twice(tmp_path):
    # two rounds; the second gradient takes 300 us for the first's 200: the links model keeps its excess over the
    # typical gradient as a tail, which the activation behind it waits out too
    r0 = Rank(0).step(1, 0, 2500).op("aten::mm", 0, 100)
    r1 = Rank(1).step(1, 0, 2600).op("aten::mm", 0, 700)
    _exchange(r0, r1, 100, 200)
    r0.op("aten::mm", 905, 1200)
    r1.op("aten::mm", 1105, 1800)
    _exchange(r0, r1, 1200, 300)
    r0.op("aten::mm", 2105, 2500)
    r1.op("aten::mm", 2305, 2600)
    return _open(tmp_path, [r0, r1])


def test_a_message_whose_ready_notice_queued_behind_the_other_way_waits_for_it(tmp_path):
    run = _behind_the_other_way(tmp_path)
    g = _exact_baseline(run).graph
    by_way = {tuple(r): row for r, row in zip(g.colls.ranks, g.colls.itertuples())}
    grad, act = by_way[(1, 0)], by_way[(0, 1)]
    # the gradient: from both ends posted (the send's call, 700) to its arrival (900); the activation's window
    # starts there, not at its own ends posted (705): 200 us of its own
    assert (grad.barrier_start_ns // US, grad.measured_transfer_ns // US, grad.after_coll) == (700, 200, -1)
    assert (act.barrier_start_ns // US, act.measured_transfer_ns // US, act.after_coll) == (900, 200, grad.coll_id)
    order = np.flatnonzero(g.edge_kind == G.E["pair_order"])
    assert len(order) == 1 and g.coll[g.src[order[0]]] == grad.coll_id and g.coll[g.dst[order[0]]] == act.coll_id
    for model in MODELS:
        # links 2x: the gradient 700 -> 800; rank 0 wakes at 805 and computes 295: 1100. The activation goes once
        # the gradient has arrived, 800 -> 900 (from its own ends posted it would be 705 -> 902.5); rank 1 wakes
        # at 905 and computes 195: 1100
        assert _steps_us(replay.run(run, _twice(model))) == [1100.0, 1100.0], model


def test_a_message_sent_before_the_other_way_was_halfway_over_did_not_queue_behind_it(tmp_path):
    # 1F1B on a fast link (seen at 400 Mbit/s): rank 1 sends its gradient (700 -> 900 on the link) and posts the
    # activation's recv at 705; rank 0's send completes at 720, so the ready notice had come, not queued behind the
    # gradient's bytes: the activation ran beside it, 705 -> 905, and its window is its own (cut at the gradient's
    # arrival it would be 5 us, which no link gives 32 KiB)
    r0 = Rank(0).step(1, 0, 1200).op("aten::mm", 0, 100)
    r1 = Rank(1).step(1, 0, 1300).op("aten::mm", 0, 700)
    _post(r0, "send", 1, 100, 720)
    _post(r0, "recv", 1, 110, 900)
    _post(r1, "send", 0, 700, 703)
    _post(r1, "recv", 0, 705, 905)
    r0.op("aten::mm", 905, 1200)
    r1.op("aten::mm", 910, 1300)
    run = _open(tmp_path, [r0, r1])
    g = _exact_baseline(run).graph
    by_way = {tuple(r): row for r, row in zip(g.colls.ranks, g.colls.itertuples())}
    grad, act = by_way[(1, 0)], by_way[(0, 1)]
    assert (grad.barrier_start_ns // US, grad.measured_transfer_ns // US, grad.after_coll) == (700, 200, -1)
    assert (act.barrier_start_ns // US, act.measured_transfer_ns // US, act.after_coll) == (705, 200, -1)
    assert not (g.edge_kind == G.E["pair_order"]).any()


def test_the_message_behind_waits_out_the_tail_of_the_one_ahead(tmp_path):
    # the links model keeps the second gradient's 100 us over the first's as its own tail (what a lone transfer
    # took beyond the typical one of its kind), after its flow: the activation queued behind it goes only then, and
    # an unchanged scenario is the run (every event; a barrier ends where its flow does, before the tail)
    run = _behind_twice(tmp_path)
    base = replay.run(run)
    res = replay.run(run, scenario_from_dict({"network": {"model": "links"}}, "same"))
    _lf, fit, _ = res.info.links_fit
    assert fit.tail_ns.max() > 0
    events = res.graph.kind != G.K["barrier"]
    assert np.array_equal(res.start_ns[events], base.start_ns[events])
    assert np.array_equal(res.end_ns[events], base.end_ns[events])


# ---- two process groups (a 2 x 2 mesh), which gloo's trace events do not name: the flight recorder does

def test_the_flight_recorder_names_each_gloo_collectives_group(tmp_path):
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
              {"pg_name": "1", "pg_desc": "mesh_dp", "ranks": [0, 2]}, {"pg_name": "2", "pg_desc": "mesh_dp", "ranks": [1, 3]},
              {"pg_name": "3", "pg_desc": "mesh_tp", "ranks": [0, 1]}, {"pg_name": "4", "pg_desc": "mesh_tp", "ranks": [2, 3]}]
    base = 1_700_000_000_000_000  # us: the flight recorder's clock is the trace's
    ranks, fr = [], {}
    for r in range(4):
        k = Rank(r).step(1, base, base + 1000)
        tp, dp = ("3" if r < 2 else "4"), ("1" if r % 2 == 0 else "2")
        entries = []
        for i, (t, pg, n) in enumerate(((100, tp, 4096), (300, dp, 8192), (500, tp, 4096))):
            k.op("c10d::allreduce_", base + t, base + t + 10, dims=[[[n]], [], [], [], [], []],
                 types=["TensorList", "", "", "", "Scalar", "Scalar"])
            k.ann("gloo:all_reduce", base + t + 5, base + t + 150, LOOP1 if pg == tp else LOOP2, dims=[[n]])
            entries.append({"record_id": i, "pg_id": int(pg), "process_group": [pg, "mesh_tp" if pg == tp else "mesh_dp"],
                            "collective_seq_id": 1 + (i // 2 if pg == tp else 0), "p2p_seq_id": 0, "op_id": i + 1,
                            "profiling_name": "gloo:all_reduce", "input_sizes": [[n]], "input_dtypes": ["Float"],
                            "output_sizes": [[n]], "output_dtypes": ["Float"], "is_p2p": False,
                            "time_created_ns": (base + t + 3) * US, "state": "scheduled", "retired": True,
                            "timeout_ms": 600000})
        k.op("aten::add", base + 700, base + 1000)
        ranks.append(k)
        fr[r] = entries
    run = _open(tmp_path, ranks, groups, fr)
    g = _exact_baseline(run).graph
    got = sorted((tuple(sorted(x)), pg) for x, pg in zip(g.colls.present_ranks, g.colls.pg_name))
    assert got == [((0, 1), "3"), ((0, 1), "3"), ((0, 2), "1"), ((1, 3), "2"), ((2, 3), "4"), ((2, 3), "4")]
    assert not any("outside the replayed ranks" in n for n in g.notes)


# ---- a one-rank group: nothing crosses a link, its time stays

def test_a_one_rank_groups_collective_keeps_its_time_under_faster_links(tmp_path):
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0]}]
    k = Rank(0).step(1, 0, 400).op("aten::mm", 0, 100)
    k.op("c10d::allreduce_", 100, 110, dims=[[[1024]], [], [], [], [], []], types=["TensorList", "", "", "", "Scalar", "Scalar"])
    k.ann("gloo:all_reduce", 105, 305, LOOP1, dims=[[1024]])
    k.op("aten::add", 310, 400)
    run = _open(tmp_path, [k], groups)
    _exact_baseline(run)
    for model in MODELS:
        assert _steps_us(replay.run(run, _twice(model))) == [400.0], model


# ---- DDP's caller waits for a bucket whose own side on its rank ends after the shared transfer

def _late_side(tmp_path, own_end=505):
    # the shared transfer ends at 405 (rank 0's runloop); rank 1's side of it ends at 505 (the last of its data on
    # a link whose token bucket ran dry), after its thread's last piece (450): rank 1 waited on the collective
    ranks = []
    for r, (loop_end, compute_end, wake) in enumerate(((405, 300, 410), (own_end, 450, own_end + 5))):
        k = Rank(r).step(1, 0, wake + 90).op("aten::mm", 0, 100)
        k.op("c10d::allreduce_", 100, 110, dims=[[[256, 256]], [], [], [], [], []],
             types=["TensorList", "", "", "", "Scalar", "Scalar"])
        k.ann("gloo:all_reduce", 105, loop_end, LOOP1, dims=[[256, 256]])
        k.op("aten::add", 110, compute_end)
        k.op("aten::mul", wake, wake + 90)
        ranks.append(k)
    return _open(tmp_path, ranks)


def test_a_caller_whose_own_side_ends_after_its_compute_waits_on_the_collective(tmp_path):
    run = _late_side(tmp_path)
    g = _exact_baseline(run).graph
    # rank 1's wake (510) binds to the collective, not to the end of its compute (450): no fixed 60 us gap
    woke = (g.edge_kind == G.E["host_wait"]) & (g.rank[g.dst] == 1)
    assert woke.sum() == 1 and g.lag_ns[woke][0] == 105 * US
    gap = (g.edge_kind == G.E["thread"]) & (g.name[g.dst] == "aten::mul") & (g.rank[g.dst] == 1)
    assert g.lag_ns[gap].tolist() == [0]
    # links twice as fast: the transfer and rank 1's own side shrink, its wait ends before its compute does, so
    # aten::mul starts as aten::add ends (without the binding it kept the 60 us and the step did not move)
    res = replay.run(run, _twice("links"))
    mul = np.flatnonzero((g.name == "aten::mul") & (g.rank == 1))[0]
    assert (res.start_ns[mul] - g.origin_ns) // US == 450
    assert _steps_us(res)[1] == 540.0


def test_a_release_longer_than_the_flows_bytes_take_keeps_the_rest_as_cpu(tmp_path):
    # rank 1's side ends 2000 us after the shared transfer (a rank descheduled on a busy machine): no more than the
    # time its 256 KiB take on the link (the transfer's 300 us) can be link time; under links twice as fast its
    # wake moves earlier by at most half of that and half the transfer, not by half of the 2000 us
    run = _late_side(tmp_path, own_end=2405)
    _exact_baseline(run)
    g = replay.run(run).graph
    mul = np.flatnonzero((g.name == "aten::mul") & (g.rank == 1))[0]
    moved = (g.start_ns[mul] - replay.run(run, _twice("links")).start_ns[mul]) / US
    assert 150 <= moved <= 150 + 150 + 1, moved


def test_an_unchanged_scenario_is_the_run_with_either_model(tmp_path):
    for make in (_tp, _fsdp, _p2p, _behind_the_other_way, _late_side):
        run = make(tmp_path / make.__name__)
        base = replay.run(run)
        for model in MODELS:
            res = replay.run(run, scenario_from_dict({"network": {"model": model}}, "same"))
            assert np.array_equal(res.start_ns, base.start_ns) and np.array_equal(res.end_ns, base.end_ns), model


def test_a_faster_link_never_slows_a_step(tmp_path):
    for make in (_tp, _fsdp, _p2p, _late_side):
        run = make(tmp_path / make.__name__)
        for model in MODELS:
            steps = [max(_steps_us(replay.run(run, scenario_from_dict(
                {"network": {"bandwidth_scale": k, "model": model}}, "k")))) for k in (0.25, 0.5, 1.0, 2.0, 3.0, 8.0)]
            assert steps == sorted(steps, reverse=True), (make.__name__, model, steps)
