"""A tiny transformer trained with DDP on gloo: the project's own source of real multi-rank traces.

Ranks run either as torch.multiprocessing children on loopback, or one process per rank inside
testbed hosts (network namespaces with shaped links) when `hosts` is given. Faults can be injected:
a slow rank (it sleeps while "loading data") and a slow link (one testbed host at a lower rate).

    python -m tracekit.capture.demo --out runs/demo --ranks 4
"""
from __future__ import annotations

import argparse
import datetime
import dataclasses
import json
import os
import socket
import sys
import time

from ..errors import TracekitError
from ._torch import require_torch
from .teardown import end_process

DEFAULT_PORT = 29521
WORKER_TIMEOUT_S = 900
COLLECTIVE_TIMEOUT_S = 300  # a dead peer fails the job in minutes, not gloo's default 30


@dataclasses.dataclass
class DemoConfig:
    out_dir: str
    ranks: int = 2
    steps: int = 3               # profiled steps
    warmup: int = 1              # profiler warm-up steps
    timed_steps: int = 4         # unprofiled steps after the profiled ones, timed only
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    vocab: int = 512
    seq_len: int = 32
    batch_size: int = 8
    bucket_mb: float = 25.0      # DDP gradient bucket size
    slow_rank: int | None = None
    slow_ms: float = 0.0         # extra data-loading time on slow_rank, per step
    hosts: int | None = None     # run on a testbed with this many hosts (None: loopback)
    link_rate_mbit: float | None = None
    slow_link_host: int | None = None
    slow_link_rate_mbit: float | None = None
    link_frames: str = "jumbo"   # testbed link kind: "jumbo" (9000-byte frames one by one) | "gso" (1500, batched)
    link_burst_bytes: int | None = None  # testbed token bucket depth (None: the kind's default)
    seed: int = 0
    master_addr: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    label: str | None = None

    def validate(self) -> None:
        if self.ranks < 1:
            raise TracekitError(f"--ranks must be >= 1, got {self.ranks}")
        if self.slow_rank is not None and not 0 <= self.slow_rank < self.ranks:
            raise TracekitError(f"--slow-rank {self.slow_rank} is not a rank of a {self.ranks}-rank job")
        if self.d_model % self.heads:
            raise TracekitError(f"--d-model {self.d_model} must be a multiple of --heads {self.heads}")
        if self.hosts is not None:
            if self.hosts < 2:
                raise TracekitError(f"--hosts must be >= 2 for a testbed run, got {self.hosts}")
            if self.ranks % self.hosts:
                raise TracekitError(f"--ranks {self.ranks} must be a multiple of --hosts {self.hosts}")
        elif (self.link_rate_mbit is not None or self.slow_link_host is not None or self.link_frames != "jumbo"
              or self.link_burst_bytes is not None):
            raise TracekitError("--link-rate-mbit, --slow-link, --link-frames and --link-burst-kb need --hosts "
                                "(a testbed run)")
        if (self.slow_link_host is None) != (self.slow_link_rate_mbit is None):
            raise TracekitError("--slow-link needs both a host and a rate (HOST:RATE_MBIT)")


# ---- the model and one rank's training loop ------------------------------------------------------
def build_model(cfg: DemoConfig):
    nn = require_torch().nn

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
            layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.heads, 4 * cfg.d_model, dropout=0.0,
                                               batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
            self.head = nn.Linear(cfg.d_model, cfg.vocab)

        def forward(self, tokens):
            # one annotation per layer: the layer structure replay's tensor/pipeline what-ifs need
            record = require_torch().profiler.record_function
            x = self.embed(tokens)
            for i, layer in enumerate(self.encoder.layers):
                with record(f"layer.{i}"):
                    x = layer(x)
            return self.head(x)

    return TinyLM()


def train_rank(cfg: DemoConfig, rank: int) -> None:
    """One rank: join the gloo group, train under tracekit.capture.profile, leave."""
    from . import profile

    torch = require_torch()
    dist = torch.distributed
    torch.set_num_threads(1)  # ranks share few cores; one thread each keeps steps comparable
    torch.manual_seed(cfg.seed)
    prof = profile(cfg.out_dir, steps=cfg.steps, warmup=cfg.warmup, record_shapes=True,
                   parallel=_parallel(cfg), extra={"demo": _demo_meta(cfg)})
    dist.init_process_group("gloo", init_method=f"tcp://{cfg.master_addr}:{cfg.port}", rank=rank,
                            world_size=cfg.ranks, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        model = torch.nn.parallel.DistributedDataParallel(build_model(cfg), bucket_cap_mb=cfg.bucket_mb)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loss_fn = torch.nn.CrossEntropyLoss()
        gen = torch.Generator().manual_seed(cfg.seed + rank)
        with prof:
            for _ in range(cfg.warmup + cfg.steps + cfg.timed_steps):
                with torch.profiler.record_function("data_loading"):
                    tokens = torch.randint(0, cfg.vocab, (cfg.batch_size, cfg.seq_len + 1), generator=gen)
                    if rank == cfg.slow_rank and cfg.slow_ms > 0:
                        time.sleep(cfg.slow_ms / 1000)
                logits = model(tokens[:, :-1])
                loss = loss_fn(logits.reshape(-1, cfg.vocab), tokens[:, 1:].reshape(-1))
                opt.zero_grad(set_to_none=True)
                with torch.profiler.record_function("backward"):
                    loss.backward()
                opt.step()
                prof.step()
    finally:
        dist.destroy_process_group()


def _parallel(cfg: DemoConfig) -> dict:
    params = sum(p.numel() for p in build_model(cfg).parameters())
    return {"dp": cfg.ranks, "tp": 1, "pp": 1, "micro_batches": 1, "model_params": params,
            "model_bytes": params * 4, "global_batch_size": cfg.batch_size * cfg.ranks,
            "ddp_bucket_mb": cfg.bucket_mb, "layers": cfg.layers,
            # fp32 activations between layers, per rank and step: what a pipeline stage sends on
            "activation_bytes": cfg.batch_size * cfg.seq_len * cfg.d_model * 4}


def _demo_meta(cfg: DemoConfig) -> dict:
    meta = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("out_dir", "master_addr", "port")}
    meta["launcher"] = "testbed" if cfg.hosts else "torch.multiprocessing"
    return meta


def _spawn_entry(rank: int, cfg: DemoConfig) -> None:
    train_rank(cfg, rank)
    end_process(0)  # no interpreter teardown for gloo's surviving worker threads to race (teardown.py)


# ---- launching ---------------------------------------------------------------------------------
def run(cfg: DemoConfig) -> dict:
    """Run the demo job; return run.json as written."""
    return run_job(cfg, _run_on_testbed if cfg.hosts else _run_local, "demo")


def run_job(cfg, launch, what: str) -> dict:
    """Validate cfg, start its output directory afresh, launch(cfg) its ranks, and return the run.json they wrote
    (a job that wrote none: one error naming `what`)."""
    cfg.validate()
    require_torch()
    os.makedirs(cfg.out_dir, exist_ok=True)
    _clear_previous(cfg.out_dir)
    launch(cfg)
    path = os.path.join(cfg.out_dir, "run.json")
    if not os.path.exists(path):
        raise TracekitError(f"{cfg.out_dir}: the {what} job finished without writing run.json")
    with open(path) as f:
        return json.load(f)


def spawn(entry, cfg, nprocs: int, what: str) -> None:
    """torch.multiprocessing.spawn of nprocs processes; a process that raised or died is one error naming
    `what` (a demo rank, a pipeline stage) and its last line."""
    mp = require_torch().multiprocessing
    try:
        mp.spawn(entry, args=(cfg,), nprocs=nprocs, join=True)
    except mp.ProcessRaisedException as e:
        raise TracekitError(f"{what} failed: {str(e).strip().splitlines()[-1]}") from None
    except mp.ProcessExitedException as e:
        raise TracekitError(f"{what} exited: {e}") from None


def _run_local(cfg: DemoConfig) -> None:
    cfg = dataclasses.replace(cfg, master_addr="127.0.0.1", port=_free_port())
    spawn(_spawn_entry, cfg, cfg.ranks, "a demo rank")


def _run_on_testbed(cfg: DemoConfig) -> None:
    slow = {cfg.slow_link_host: cfg.slow_link_rate_mbit} if cfg.slow_link_host is not None else None
    run_on_testbed(cfg, "tracekit.capture.demo", cfg.ranks, cfg.hosts, cfg.link_rate_mbit, slow,
                   frames=cfg.link_frames, burst_bytes=cfg.link_burst_bytes)


def run_on_testbed(cfg, module: str, ranks: int, hosts: int, rate_mbit, slow: dict | None = None,
                   poll_idle: bool = False, frames: str = "jumbo", burst_bytes: int | None = None) -> None:
    """Run `python -m module --worker-rank R --worker-config CFG` for every rank inside a testbed of `hosts`
    hosts (rank r on host r // (ranks / hosts)), the master on host 0; one error naming every rank that
    failed; run.json gets the testbed's description (and with poll_idle, whether the CPUs were held out of
    their idle states: tracekit.testbed.PollIdle); frames and burst_bytes: the links' kind (tracekit.testbed)."""
    import contextlib

    from ..testbed import PollIdle, Testbed

    per_host = ranks // hosts
    held = PollIdle() if poll_idle else None
    bed = Testbed(hosts, rate_mbit, host_rates_mbit=slow, frames=frames, burst_bytes=burst_bytes)
    with bed as tb, (held or contextlib.nullcontext()):
        if held is not None and held.reason:
            raise TracekitError(f"--poll-idle: {held.reason}")
        cfg = dataclasses.replace(cfg, master_addr=tb.hosts[0].ip, port=cfg.port or DEFAULT_PORT)
        meta = tb.describe()
        commands = [(rank // per_host, [sys.executable, "-m", module, "--worker-rank", str(rank),
                                        "--worker-config", json.dumps(dataclasses.asdict(cfg))])
                    for rank in range(ranks)]
        results = tb.run_all(commands, timeout_s=WORKER_TIMEOUT_S)
    errors = [f"rank {rank} exited {code}: {_last_line(err)}" for rank, (code, _out, err) in enumerate(results)
              if code != 0]
    if errors:
        raise TracekitError("job on the testbed failed: " + "; ".join(errors))
    _annotate_manifest(cfg.out_dir, {"testbed": {**meta, "poll_idle": bool(poll_idle)}})


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip() and not line.startswith("USDT")]
    return lines[-1] if lines else "(no output)"


def _annotate_manifest(out_dir: str, extra: dict) -> None:
    from .manifest import write

    path = os.path.join(out_dir, "run.json")
    if os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
        doc.update(extra)
        write(out_dir, doc)


def _clear_previous(out_dir: str) -> None:
    """A rerun into the same directory must not leave ranks from a bigger earlier job behind."""
    for name in os.listdir(out_dir):
        if name == "run.json" or (name.startswith("rank") and name.endswith((".trace.json.gz", ".fr.json"))):
            os.remove(os.path.join(out_dir, name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarize(doc: dict) -> str:
    times_ms = [t / 1e6 for t in doc.get("step_times_ns", [])]
    timed = sorted(times_ms[doc["profiler"]["warmup_steps"]:]) or sorted(times_ms)
    med = timed[len(timed) // 2] if timed else float("nan")
    return (f"{doc['world_size']} rank(s), backend {doc['backend']}, {doc['step_count']} steps, "
            f"median step {med:.1f} ms, model {doc['parallel'].get('model_params')} params")


# ---- command line (python -m tracekit.capture.demo) -------------------------------------------
def module_main(ap: argparse.ArgumentParser, argv, config_cls, train, run_job, summary, config_of) -> int:
    """A demo job's `python -m` entry: a testbed worker (--worker-rank, started by run_on_testbed) trains its rank
    and ends its process; otherwise the job runs with config_of(parsed arguments) and its summary is printed. A
    TracekitError is one line, exit 2."""
    ap.add_argument("--worker-rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--worker-config", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker_rank is not None:
        train(config_cls(**json.loads(a.worker_config)), a.worker_rank)
        end_process(0)  # as _spawn_entry
    if not a.out:
        ap.error("--out is required")
    try:
        doc = run_job(config_of(a))
    except TracekitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(summary(doc))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tracekit.capture.demo",
                                 description="Train a tiny transformer with DDP on gloo and capture it.")
    ap.add_argument("--out")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    return module_main(ap, argv, DemoConfig, train_rank, run, summarize,
                       lambda a: DemoConfig(out_dir=a.out, ranks=a.ranks, steps=a.steps))


if __name__ == "__main__":
    sys.exit(main())
