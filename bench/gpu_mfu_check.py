"""A GPU check of tracekit's FLOPs and MFU, against an oracle it does not share code with: its MFU of a
recorded bf16 transformer training step against FlopCounterMode's FLOPs / the measured step time / the catalog's peak for the GPU it ran on.

    python bench/gpu_mfu_check.py [--out DIR] [--device cuda]     # on a machine with a GPU, ~1 min

Records a few steps of a GPT-like model (bf16 autocast, SDPA attention, AdamW) under torch.profiler with
record_shapes, ingests the trace with tracekit, and prints one JSON object: per step tracekit's FLOPs and
FlopCounterMode's, the step times, tracekit's mfu_pct and the oracle's (FlopCounterMode FLOPs / the
profiled step's time / the catalog peak), and the ratio of the two (target: within 3%). With
--device cpu it runs the same pipeline on CPU (FLOPs only: a CPU has no catalog peak), to check the
script itself.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def model_and_data(device, d=1024, layers=8, heads=16, seq=1024, batch=8, vocab=32768):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
            return x + self.fc2(F.gelu(self.fc1(self.n2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            return self.head(self.blocks(self.emb(idx)))

    torch.manual_seed(0)
    m = GPT().to(device)
    idx = torch.randint(0, vocab, (batch, seq), device=device)
    return m, idx, vocab


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="a small model (for --device cpu)")
    a = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, schedule
    from torch.utils.flop_counter import FlopCounterMode

    import tracekit

    dev = torch.device(a.device)
    kw = dict(d=64, layers=2, heads=4, seq=64, batch=2, vocab=512) if a.small else {}
    model, idx, vocab = model_and_data(dev, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    amp = torch.autocast(dev.type, dtype=torch.bfloat16)

    def step():
        opt.zero_grad(set_to_none=True)
        with amp:
            loss = F.cross_entropy(model(idx).view(-1, vocab), idx.view(-1))
        loss.backward()
        opt.step()

    for _ in range(3):  # warm-up: kernels chosen, optimizer state allocated
        step()
    fc = FlopCounterMode(display=False)
    with fc:
        step()
    oracle_flops = fc.get_total_flops()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    trace_dir = Path(a.out) / "trace"
    trace_dir.mkdir(parents=True, exist_ok=True)
    with profile(activities=acts, record_shapes=True, schedule=schedule(wait=0, warmup=1, active=4),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(trace_dir / "rank0.trace.json"))) as prof:
        for _ in range(5):
            step()
            if dev.type == "cuda":
                torch.cuda.synchronize()  # each ProfilerStep holds its own GPU work
            prof.step()
    run = tracekit.open(str(trace_dir), store=str(Path(a.out) / "store"))
    mfu = run.analyze("mfu", by_step=True)
    out = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "oracle_flops_per_step": int(oracle_flops), "note": mfu.attrs.get("note"), "steps": []}
    import pandas as pd

    for r in mfu.itertuples():
        known = not pd.isna(r.peak_tflops)
        row = {"step": int(r.step), "flops": int(r.flops), "flops_ratio": r.flops / oracle_flops,
               "step_ns": int(r.step_ns), "mfu_pct": float(r.mfu_pct) if known else None,
               "peak_tflops": float(r.peak_tflops) if known else None}
        if known:
            row["oracle_mfu_pct"] = 100.0 * oracle_flops / r.step_ns / 1e3 / r.peak_tflops
            row["mfu_ratio"] = row["mfu_pct"] / row["oracle_mfu_pct"]
        out["steps"].append(row)
    ratios = [s.get("mfu_ratio", s["flops_ratio"]) for s in out["steps"]]
    out["worst_ratio"] = max(ratios, key=lambda x: abs(x - 1)) if ratios else None
    run.close()
    print(json.dumps(out, indent=1))
    (Path(a.out) / "gpu_mfu_check.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
