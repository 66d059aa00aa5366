"""Clock alignment: one rank of a real 8-rank trace shifted by +0.8 s is found and corrected."""
from __future__ import annotations

import gzip
import json
import shutil

import pytest
from click.testing import CliRunner

import tracekit
from analyses import comms
from tracekit.cli import cli

from .conftest import shared_trace_dir

pytestmark = pytest.mark.slow  # an 8-rank shared trace, shifted and ingested twice

MEGATRON_REL = "astra-sim/megatron_tp8"
SHIFT_US = 800_000  # +0.8 s
SHIFTED_RANK = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    megatron = shared_trace_dir(MEGATRON_REL)
    root = tmp_path_factory.mktemp("clock")
    d = root / "shifted"
    d.mkdir()
    for i in range(8):
        src = megatron / f"megatron_kineto_{i}.json.gz"
        if i != SHIFTED_RANK:
            shutil.copy(src, d / src.name)
            continue
        doc = json.loads(gzip.decompress(src.read_bytes()))
        for ev in doc["traceEvents"]:
            if "ts" in ev:  # absolute microseconds (no baseTimeNanoseconds in this trace)
                ev["ts"] = ev["ts"] + SHIFT_US
        (d / src.name).write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    original = tracekit.open(megatron, store=str(root / "orig_store"))
    shifted = tracekit.open(d, store=str(root / "shifted_store"))
    yield original, shifted
    original.close()
    shifted.close()


def test_shifted_rank_offset_recovered_within_50us(runs):
    original, shifted = runs
    base = comms.clock_offsets(original).set_index("rank")["clock_offset_ns"]
    est = comms.clock_offsets(shifted).set_index("rank")["clock_offset_ns"]
    assert abs(est[SHIFTED_RANK] - (-SHIFT_US * 1000)) < 50_000
    # and the shift on top of what the unshifted trace gives; the others barely move (a few us: with rank 3
    # an outlier, each collective's median end is taken over the other ends, quantised to 1 us in this trace)
    assert abs((est[SHIFTED_RANK] - base[SHIFTED_RANK]) - (-SHIFT_US * 1000)) < 5_000
    assert (est.drop(index=SHIFTED_RANK) - base.drop(index=SHIFTED_RANK)).abs().max() < 5_000


def test_aligned_analyses_undo_the_shift_and_say_so(runs):
    original, shifted = runs
    raw = comms.collectives_matched(shifted)
    assert raw[raw["timeline"] == "gpu"]["arrival_skew_ns"].min() > 700e6  # the shift dominates every skew
    aligned = comms.collectives_matched(shifted, aligned=True)
    ref = comms.collectives_matched(original, aligned=True)
    gpu, ref_gpu = aligned[aligned["timeline"] == "gpu"], ref[ref["timeline"] == "gpu"]
    assert list(gpu["match_key"]) == list(ref_gpu["match_key"])
    assert (gpu["arrival_skew_ns"].to_numpy() - ref_gpu["arrival_skew_ns"].to_numpy()).__abs__().max() < 5_000
    assert "clock offsets" in aligned.attrs["note"] and f"rank {SHIFTED_RANK}: -8" in aligned.attrs["note"]
    s = comms.straggler_attribution(shifted, aligned=True)
    assert list(s["rank"][:2]) == [0, 6]


def test_cli_align(runs):
    _, shifted = runs
    r = CliRunner().invoke(cli, ["comms", "align", shifted.trace_dir, "--store", shifted.store.path, "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = {row["rank"]: row for row in json.loads(r.stdout)}
    assert rows[0]["clock_offset_ns"] == 0 and rows[0]["reference_rank"] == 0
    assert abs(rows[SHIFTED_RANK]["clock_offset_ns"] + SHIFT_US * 1000) < 50_000
