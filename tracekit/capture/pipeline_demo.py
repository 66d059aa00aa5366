"""A tiny pipeline-parallel job on gloo: the project's own source of real pipeline traces.

One rank per stage (dp = tp = 1); stage s holds `stage_layers[s]` blocks (Linear + ReLU) of the same
width, so a stage's compute is proportional to its layer count and a layout like (3, 1) is a deliberately
unbalanced pipeline, (2, 2) the same model balanced. Each step runs `micro_batches` micro-batches under the
1F1B schedule (replay/pipeline.py's order): activations go forward and their gradients back with
isend / blocking recv (a stage blocks only where it needs its neighbour's tensor). run.json's `parallel`
block names the stages' ranks (`stages`) and their layer counts.

    python -m tracekit.capture.pipeline_demo --out runs/pp_unbalanced --stage-layers 3,1
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys

from ..errors import TracekitError
from ._torch import require_torch
from .demo import COLLECTIVE_TIMEOUT_S, _clear_previous, _free_port, spawn
from .teardown import end_process


@dataclasses.dataclass
class PipelineConfig:
    out_dir: str
    stage_layers: tuple[int, ...] = (3, 1)  # blocks per stage; one rank per stage
    micro_batches: int = 4
    d_model: int = 256
    batch_size: int = 64         # samples per micro-batch
    steps: int = 3               # profiled steps
    warmup: int = 1
    timed_steps: int = 3         # unprofiled steps after the profiled ones, timed only
    seed: int = 0
    port: int = 0

    def validate(self) -> None:
        if len(self.stage_layers) < 2:
            raise TracekitError(f"a pipeline needs at least 2 stages, got {len(self.stage_layers)}")
        if any(n < 1 for n in self.stage_layers):
            raise TracekitError(f"every stage needs at least one layer, got {list(self.stage_layers)}")
        if self.micro_batches < 1 or self.steps < 1:
            raise TracekitError("micro_batches and steps must be >= 1")

    @property
    def stages(self) -> int:
        return len(self.stage_layers)


def schedule(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The 1F1B order of one stage: min(P - s - 1, m) warm-up forwards, then one forward and one backward
    in turn, then the remaining backwards (replay/pipeline.pipeline_makespan's "1f1b" replays the same order)."""
    warm = min(stages - stage - 1, micro_batches)
    order = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < micro_batches or b < micro_batches:
        if f < micro_batches:
            order.append(("F", f))
            f += 1
        if b < micro_batches:
            order.append(("B", b))
            b += 1
    return order


def _parallel(cfg: PipelineConfig) -> dict:
    d = cfg.d_model
    return {"dp": 1, "tp": 1, "pp": cfg.stages, "micro_batches": cfg.micro_batches,
            "stages": [[s] for s in range(cfg.stages)], "stage_layers": list(cfg.stage_layers),
            "layers": sum(cfg.stage_layers), "model_params": sum(cfg.stage_layers) * (d * d + d),
            "global_batch_size": cfg.batch_size * cfg.micro_batches,
            # fp32 activations a stage hands the next per step (all micro-batches)
            "activation_bytes": cfg.batch_size * cfg.micro_batches * d * 4}


def train_stage(cfg: PipelineConfig, rank: int) -> None:
    """One stage: join the gloo group, run the 1F1B steps under tracekit.capture.profile, leave."""
    from . import profile

    torch = require_torch()
    dist = torch.distributed
    torch.set_num_threads(1)  # stages share few cores; one thread each keeps their compute comparable
    torch.manual_seed(cfg.seed + rank)
    P, m, d = cfg.stages, cfg.micro_batches, cfg.d_model
    first = sum(cfg.stage_layers[:rank])
    blocks = [torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.ReLU()) for _ in range(cfg.stage_layers[rank])]
    opt = torch.optim.SGD([p for b in blocks for p in b.parameters()], lr=1e-3)
    gen = torch.Generator().manual_seed(cfg.seed)
    prof = profile(cfg.out_dir, steps=cfg.steps, warmup=cfg.warmup, record_shapes=True, parallel=_parallel(cfg),
                   extra={"demo": {"kind": "pipeline", **{k: v for k, v in dataclasses.asdict(cfg).items()
                                                          if k not in ("out_dir", "port")}}})
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg.port}", rank=rank, world_size=P,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))

    def stage_forward(x):
        for i, b in enumerate(blocks):
            with torch.profiler.record_function(f"layer.{first + i}"):
                x = b(x)
        return x

    try:
        with prof:
            for _ in range(cfg.warmup + cfg.steps + cfg.timed_steps):
                inputs = [torch.randn(cfg.batch_size, d, generator=gen) for _ in range(m)]
                targets = [torch.randn(cfg.batch_size, d, generator=gen) for _ in range(m)]
                saved, sends = {}, []
                opt.zero_grad(set_to_none=True)
                for kind, i in schedule(rank, P, m):
                    if kind == "F":
                        with torch.profiler.record_function("forward"):
                            if rank == 0:
                                x = inputs[i]
                            else:
                                x = torch.empty(cfg.batch_size, d)
                                dist.recv(x, rank - 1, tag=0)
                                x.requires_grad_()
                            y = stage_forward(x)
                            if rank == P - 1:
                                y = torch.nn.functional.mse_loss(y, targets[i]) / m
                            else:
                                sends.append(dist.isend(y.detach(), rank + 1, tag=0))
                            saved[i] = (x, y)
                    else:
                        with torch.profiler.record_function("backward"):
                            x, y = saved.pop(i)
                            if rank == P - 1:
                                y.backward()
                            else:
                                g = torch.empty_like(y)
                                dist.recv(g, rank + 1, tag=1)
                                y.backward(g)
                            if rank > 0:
                                sends.append(dist.isend(x.grad, rank - 1, tag=1))
                for w in sends:
                    w.wait()
                opt.step()
                prof.step()
    finally:
        dist.destroy_process_group()


def _spawn_entry(rank: int, cfg: PipelineConfig) -> None:
    train_stage(cfg, rank)
    end_process(0)  # as the DDP demo: no interpreter teardown for gloo's worker threads to race (teardown.py)


def run(cfg: PipelineConfig) -> dict:
    """Run the pipeline job on loopback (torch.multiprocessing, one process per stage); return run.json."""
    cfg.validate()
    os.makedirs(cfg.out_dir, exist_ok=True)
    _clear_previous(cfg.out_dir)
    cfg = dataclasses.replace(cfg, port=cfg.port or _free_port())
    spawn(_spawn_entry, cfg, cfg.stages, "a pipeline stage")
    path = os.path.join(cfg.out_dir, "run.json")
    if not os.path.exists(path):
        raise TracekitError(f"{cfg.out_dir}: the pipeline job finished without writing run.json")
    with open(path) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tracekit.capture.pipeline_demo",
                                 description="Train a tiny pipeline-parallel MLP on gloo (one rank per stage) "
                                             "and capture it.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--stage-layers", default="3,1", help="blocks per stage, comma-separated (default 3,1)")
    for name, default in (("micro-batches", 4), ("d-model", 256), ("batch-size", 64), ("steps", 3), ("warmup", 1),
                          ("timed-steps", 3)):
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args(argv)
    try:
        layers = tuple(int(x) for x in a.stage_layers.split(","))
    except ValueError:
        print(f"error: --stage-layers {a.stage_layers!r}: expected integers separated by commas", file=sys.stderr)
        return 2
    try:
        doc = run(PipelineConfig(out_dir=a.out, stage_layers=layers, micro_batches=a.micro_batches,
                                 d_model=a.d_model, batch_size=a.batch_size, steps=a.steps, warmup=a.warmup,
                                 timed_steps=a.timed_steps))
    except TracekitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    times = sorted(doc["step_times_ns"][doc["profiler"]["warmup_steps"]:])
    print(f"{doc['world_size']} stage(s) {list(layers)}, median step {times[len(times) // 2] / 1e6:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
