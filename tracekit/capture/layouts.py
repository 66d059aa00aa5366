"""One small transformer trained under every parallel layout, with PyTorch's own APIs, on gloo (CPU).

The layouts, each from the API a user of it calls:

    ddp              DistributedDataParallel (torch.nn.parallel)
    fsdp             FSDP2: `fully_shard` on every block, then on the root (reshard_after_forward=True)
    fsdp_noreshard   the same with reshard_after_forward=False (no all-gather again before the backward)
    tp               DTensor tensor parallelism: `parallelize_module` with ColwiseParallel on wq / wk / wv / w1
                     and RowwiseParallel on wo / w2 (Megatron's split of attention and MLP)
    tp_sp            the same plus sequence parallelism (SequenceParallel norms: all-gather / reduce-scatter
                     instead of the all-reduces)
    pp_gpipe         `torch.distributed.pipelining`: one PipelineStage per rank, ScheduleGPipe
    pp_1f1b          the same with Schedule1F1B
    fsdp_tp          2-D on 4 ranks: TP over mesh dim "tp" (ranks next to each other), FSDP2 over "dp"
    dp_pp            2-D on 4 ranks: a 2-stage pipeline over "pp", each stage replicated over "dp" with
                     `replicate` (torch.distributed._composable, torchtitan's data-parallel replicate: one
                     gradient all-reduce a step). DistributedDataParallel does not combine with pipelining's
                     schedules here: its reducer asserts on the second step ("rebuilt parameter indices"), and
                     with static_graph=True the last stage never all-reduces its gradients

Every layout trains the same model (token embedding, `layers` pre-norm blocks of attention and a GELU MLP,
final norm and output head) on the same global batch of `batch_size` x `seq_len` tokens a step, so that the
layouts compare: data-parallel ranks take their share of the samples, tensor-parallel ranks all see the
whole batch, a pipeline splits it into `micro_batches`.

Ranks are torch.multiprocessing children on loopback, or one process per rank inside testbed hosts
(network namespaces with shaped links) with `hosts`: rank r runs on host r // (ranks / hosts), so a mesh's
last dimension (tp, pp) stays inside a host when hosts hold two ranks.

    python -m tracekit.capture.layouts --out runs/tp --layout tp --ranks 2
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys

from ..errors import TracekitError
from ._torch import require_torch
from .demo import COLLECTIVE_TIMEOUT_S, _free_port, module_main, run_job, run_on_testbed, spawn
from .teardown import end_process

# layout -> mesh dimension names, outermost first (one dimension: the whole world)
LAYOUTS = {
    "ddp": ("dp",), "fsdp": ("dp",), "fsdp_noreshard": ("dp",), "tp": ("tp",), "tp_sp": ("tp",),
    "pp_gpipe": ("pp",), "pp_1f1b": ("pp",), "fsdp_tp": ("dp", "tp"), "dp_pp": ("dp", "pp"),
}

CHECKPOINTING = ("none", "full")


@dataclasses.dataclass
class LayoutConfig:
    out_dir: str
    layout: str = "ddp"
    ranks: int = 2
    d_model: int = 128
    layers: int = 4
    heads: int = 4
    vocab: int = 512
    seq_len: int = 64
    batch_size: int = 8          # samples per step, the whole job's (the global batch)
    micro_batches: int = 4       # pipeline layouts
    steps: int = 3               # profiled steps
    warmup: int = 1
    timed_steps: int = 3
    hosts: int | None = None     # run on a testbed with this many hosts (None: loopback)
    link_rate_mbit: float | None = None
    poll_idle: bool = False      # hold the CPUs out of their idle states while it runs (tracekit.testbed.PollIdle)
    checkpointing: str = "none"  # "full": every block's forward recomputed in its backward (activation checkpointing)
    profile_memory: bool = False  # record the allocator's [memory] events
    seed: int = 0
    master_addr: str = "127.0.0.1"
    port: int = 0

    def validate(self) -> None:
        if self.layout not in LAYOUTS:
            raise TracekitError(f"--layout {self.layout!r}; allowed: {', '.join(LAYOUTS)}")
        if self.checkpointing not in CHECKPOINTING:
            raise TracekitError(f"--checkpointing {self.checkpointing!r}; allowed: {', '.join(CHECKPOINTING)}")
        dims = LAYOUTS[self.layout]
        if len(dims) == 2 and self.ranks != 4:
            raise TracekitError(f"--layout {self.layout} is 2-D (2 x 2): it needs --ranks 4, got {self.ranks}")
        if self.ranks < 2:
            raise TracekitError(f"--ranks must be >= 2 for a parallel layout, got {self.ranks}")
        if self.d_model % self.heads:
            raise TracekitError(f"--d-model {self.d_model} must be a multiple of --heads {self.heads}")
        sizes = self.mesh_shape()
        d = dict(zip(dims, sizes))
        if self.heads % d.get("tp", 1):
            raise TracekitError(f"--heads {self.heads} must split over {d['tp']} tensor-parallel ranks")
        if self.layers % d.get("pp", 1):
            raise TracekitError(f"--layers {self.layers} must split evenly over {d['pp']} pipeline stages")
        samples = self.batch_size // d.get("dp", 1)
        if self.batch_size % d.get("dp", 1) or samples % (self.micro_batches if "pp" in d else 1):
            raise TracekitError(f"--batch-size {self.batch_size} must split over {d.get('dp', 1)} data-parallel "
                                f"ranks{' and ' + str(self.micro_batches) + ' micro-batches' if 'pp' in d else ''}")
        if self.hosts is not None:
            if self.hosts < 2 or self.ranks % self.hosts:
                raise TracekitError(f"--ranks {self.ranks} must be a multiple of --hosts {self.hosts} (>= 2)")
        elif self.link_rate_mbit is not None or self.poll_idle:
            raise TracekitError("--link-rate-mbit and --poll-idle need --hosts (a testbed run)")

    def mesh_shape(self) -> tuple[int, ...]:
        dims = LAYOUTS[self.layout]
        return (self.ranks,) if len(dims) == 1 else (self.ranks // 2, 2)

    def degrees(self) -> dict[str, int]:
        d = dict(zip(LAYOUTS[self.layout], self.mesh_shape()))
        return {k: d.get(k, 1) for k in ("dp", "tp", "pp")}


# ---- the model ----------------------------------------------------------------------------------------
def build_model(cfg: LayoutConfig):
    """The transformer every layout trains; submodule names follow torchtitan's (attention.wq, feed_forward.w1)."""
    torch = require_torch()
    nn, F = torch.nn, torch.nn.functional
    d, hd = cfg.d_model, cfg.d_model // cfg.heads

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d) for _ in range(4))

        def forward(self, x):
            b, s, _ = x.shape
            # -1 heads: a tensor-parallel rank holds its share of them
            q, k, v = (w(x).view(b, s, -1, hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(a.transpose(1, 2).reshape(b, s, -1))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            return self.w2(F.gelu(self.w1(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.attention = nn.LayerNorm(d), Attention()
            self.ffn_norm, self.feed_forward = nn.LayerNorm(d), FeedForward()

        def forward(self, x):
            x = x + self.attention(self.attention_norm(x))
            return x + self.feed_forward(self.ffn_norm(x))

    class Transformer(nn.Module):
        """tok_embeddings and norm / output are None on the pipeline stages that do not hold them."""

        def __init__(self, first: bool = True, last: bool = True, n_layers: int = cfg.layers):
            super().__init__()
            self.tok_embeddings = nn.Embedding(cfg.vocab, d) if first else None
            self.layers = nn.ModuleDict({str(i): Block() for i in range(n_layers)})
            self.norm = nn.LayerNorm(d) if last else None
            self.output = nn.Linear(d, cfg.vocab) if last else None

        def forward(self, x):
            h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
            for layer in self.layers.values():
                h = layer(h)
            return self.output(self.norm(h)) if self.output is not None else h

    return Transformer


def model_params(cfg: LayoutConfig) -> int:
    d, L, V = cfg.d_model, cfg.layers, cfg.vocab
    block = 4 * (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d) + 4 * d  # attention, MLP, two norms
    return L * block + V * d + 2 * d + (d * V + V)


# ---- one rank ------------------------------------------------------------------------------------------
def train_rank(cfg: LayoutConfig, rank: int) -> None:
    from . import profile

    torch = require_torch()
    dist = torch.distributed
    torch.set_num_threads(1)  # ranks share few cores; one thread each keeps steps comparable
    prof = profile(cfg.out_dir, steps=cfg.steps, warmup=cfg.warmup, record_shapes=True,
                   profile_memory=cfg.profile_memory, parallel=_parallel(cfg), extra={"demo": _meta(cfg)})
    dist.init_process_group("gloo", init_method=f"tcp://{cfg.master_addr}:{cfg.port}", rank=rank,
                            world_size=cfg.ranks, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        from torch.distributed.device_mesh import init_device_mesh

        dims = LAYOUTS[cfg.layout]
        mesh = init_device_mesh("cpu", cfg.mesh_shape(), mesh_dim_names=dims)
        step = (_pipeline_job if "pp" in dims else _sharded_job)(cfg, rank, mesh)
        with prof:
            for _ in range(cfg.warmup + cfg.steps + cfg.timed_steps):
                step()
                prof.step()
    finally:
        dist.destroy_process_group()


def _batch(cfg: LayoutConfig, gen, samples: int):
    torch = require_torch()
    tokens = torch.randint(0, cfg.vocab, (samples, cfg.seq_len + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def _sharded_job(cfg: LayoutConfig, rank: int, mesh):
    """DDP, FSDP2, TP and FSDP x TP: one model per rank, parallelised by the layout's API; returns step()."""
    torch = require_torch()
    torch.manual_seed(cfg.seed)  # every rank starts from the same weights
    model = build_model(cfg)()
    deg = cfg.degrees()
    if deg["tp"] > 1:
        _tensor_parallel(model, mesh["tp"], sequence=cfg.layout == "tp_sp")
    _checkpoint(model, cfg)  # torchtitan's order: tensor parallel, then checkpointing, then FSDP
    if cfg.layout == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif cfg.layout.startswith("fsdp"):
        from torch.distributed.fsdp import fully_shard

        reshard = cfg.layout != "fsdp_noreshard"
        for block in model.layers.values():
            fully_shard(block, mesh=mesh["dp"], reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh["dp"], reshard_after_forward=reshard)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    dp_rank = mesh["dp"].get_local_rank() if "dp" in mesh.mesh_dim_names else 0
    # tensor-parallel ranks of one data-parallel replica draw the same samples
    gen = torch.Generator().manual_seed(cfg.seed + 1 + dp_rank)
    samples = cfg.batch_size // deg["dp"]

    def step():
        with torch.profiler.record_function("data_loading"):
            x, y = _batch(cfg, gen, samples)
        logits = model(x)
        loss = loss_fn(logits.reshape(-1, cfg.vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _checkpoint(model, cfg: LayoutConfig) -> None:
    """Full activation checkpointing as torchtitan applies it: every block wrapped by PyTorch's checkpoint_wrapper
    (non-reentrant torch.utils.checkpoint), which keeps only the block's input and recomputes its forward in the
    backward. Applied before the layout's API wraps the blocks."""
    if cfg.checkpointing == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for name, block in list(model.layers.items()):
        model.layers[name] = checkpoint_wrapper(block)


def _tensor_parallel(model, tp_mesh, sequence: bool) -> None:
    """Megatron's split with DTensor: column-parallel wq / wk / wv / w1, row-parallel wo / w2; with sequence
    parallelism the norms run sharded on the sequence and the blocks gather their input."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    if sequence:
        parallelize_module(model, tp_mesh, {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        })
    for block in model.layers.values():
        plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "feed_forward.w1": ColwiseParallel()}
        if sequence:
            gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            plan.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                         "attention": gather, "feed_forward": gather,
                         "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                         "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))})
        else:
            plan.update({"attention.wo": RowwiseParallel(), "feed_forward.w2": RowwiseParallel()})
        parallelize_module(block, tp_mesh, plan)


def _pipeline_job(cfg: LayoutConfig, rank: int, mesh):
    """A pipeline over mesh dim "pp" (torch.distributed.pipelining), each stage replicated over "dp" when there is
    one."""
    torch = require_torch()
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    pp = mesh["pp"]
    stages, stage = pp.size(), pp.get_local_rank()
    per = cfg.layers // stages
    torch.manual_seed(cfg.seed + stage)
    mod = build_model(cfg)(first=stage == 0, last=stage == stages - 1, n_layers=per)
    _checkpoint(mod, cfg)
    if "dp" in mesh.mesh_dim_names and mesh["dp"].size() > 1:
        from torch.distributed._composable.replicate_with_fsdp import replicate

        replicate(mod, mesh=mesh["dp"])
    pstage = PipelineStage(mod, stage, stages, torch.device("cpu"), group=pp.get_group())
    loss_fn = torch.nn.CrossEntropyLoss()

    def loss(logits, y):
        return loss_fn(logits.reshape(-1, cfg.vocab), y.reshape(-1))

    kind = ScheduleGPipe if cfg.layout in ("pp_gpipe", "dp_pp") else Schedule1F1B
    schedule = kind(pstage, n_microbatches=cfg.micro_batches, loss_fn=loss)
    opt = torch.optim.AdamW(mod.parameters(), lr=1e-3)
    dp_rank = mesh["dp"].get_local_rank() if "dp" in mesh.mesh_dim_names else 0
    gen = torch.Generator().manual_seed(cfg.seed + 1 + dp_rank)  # both stages of a replica draw the same batch
    samples = cfg.batch_size // cfg.degrees()["dp"]

    def step():
        with torch.profiler.record_function("data_loading"):
            x, y = _batch(cfg, gen, samples)
        if stage == 0:
            schedule.step(x)
        elif stage == stages - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _parallel(cfg: LayoutConfig) -> dict:
    deg = cfg.degrees()
    dims = LAYOUTS[cfg.layout]
    return {**deg, "micro_batches": cfg.micro_batches if "pp" in dims else 1, "layout": cfg.layout,
            "mesh": dict(zip(dims, cfg.mesh_shape())), "model_params": model_params(cfg),
            "model_bytes": model_params(cfg) * 4, "global_batch_size": cfg.batch_size, "layers": cfg.layers,
            "seq_len": cfg.seq_len, "d_model": cfg.d_model, "heads": cfg.heads,
            # DP x PP's data parallelism is FSDP2's replicate ([parallelism] sharding = "replicate")
            "sharding": ("fsdp" if cfg.layout.startswith("fsdp") else "replicate" if cfg.layout == "dp_pp"
                         else "none"),
            "checkpointing": cfg.checkpointing}


def _meta(cfg: LayoutConfig) -> dict:
    meta = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("out_dir", "master_addr", "port")}
    meta["kind"] = "layouts"
    meta["launcher"] = "testbed" if cfg.hosts else "torch.multiprocessing"
    return meta


def _spawn_entry(rank: int, cfg: LayoutConfig) -> None:
    train_rank(cfg, rank)
    end_process(0)  # no interpreter teardown for gloo's worker threads to race (teardown.py)


# ---- launching -----------------------------------------------------------------------------------------
def run(cfg: LayoutConfig) -> dict:
    """Run the job; return run.json as written."""
    return run_job(cfg, _launch, cfg.layout)


def _launch(cfg: LayoutConfig) -> None:
    if cfg.hosts:
        run_on_testbed(cfg, "tracekit.capture.layouts", cfg.ranks, cfg.hosts, cfg.link_rate_mbit,
                       poll_idle=cfg.poll_idle)
    else:
        spawn(_spawn_entry, dataclasses.replace(cfg, master_addr="127.0.0.1", port=_free_port()), cfg.ranks,
              f"a {cfg.layout} rank")


def summarize(doc: dict) -> str:
    times = sorted(doc["step_times_ns"][doc["profiler"]["warmup_steps"]:]) or [float("nan")]
    par = doc.get("parallel") or {}
    return (f"{par.get('layout')} on {doc['world_size']} rank(s) {par.get('mesh')}, median step "
            f"{times[len(times) // 2] / 1e6:.1f} ms, {par.get('model_params')} params")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tracekit.capture.layouts",
                                 description="Train a small transformer under a parallel layout on gloo, captured.")
    ap.add_argument("--out")
    ap.add_argument("--layout", default="ddp", choices=list(LAYOUTS))
    ap.add_argument("--ranks", type=int, default=2)
    return module_main(ap, argv, LayoutConfig, train_rank, run, summarize,
                       lambda a: LayoutConfig(out_dir=a.out, layout=a.layout, ranks=a.ranks))


if __name__ == "__main__":
    sys.exit(main())
