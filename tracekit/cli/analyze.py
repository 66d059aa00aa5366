"""`tracekit analyze`: run one named analysis over a run's store and print it."""
from __future__ import annotations

import inspect

import click

from ..errors import TracekitError
from ._common import emit, emit_result, fail_cleanly, format_option, store_option


@click.command("analyze")
@click.argument("name", required=False)
@click.argument("trace_dir", required=False, type=click.Path(exists=True, file_okay=False))
@click.option("--list", "list_", is_flag=True, help="List the analyses with a one-line description and exit.")
@click.option("--rank", type=int, default=None, help="Only this global rank.")
@click.option("--step", type=int, default=None, help="Only ops launched in ProfilerStep#STEP.")
@click.option("--by-step", is_flag=True, default=None, help="One row per step instead of per rank (where supported).")
@click.option("--drop-last-step", is_flag=True, default=None,
              help="HolisticTraceAnalysis's scope: drop the last step and ops without a launch call.")
@click.option("--top-k", type=int, default=None, help="Kernel names kept per class before pooling into 'others'.")
@click.option("--rules", type=click.Path(exists=True, dir_okay=False), default=None,
              help="TOML file of [[rule]] class/pattern kernel-classification rules, tried before the defaults.")
@click.option("--against", type=click.Path(exists=True, file_okay=False), default=None,
              help="trace_diff: the other trace directory (or store) to compare with.")
@click.option("--against-store", type=click.Path(file_okay=False), default=None,
              help="trace_diff: store directory for --against.")
@click.option("--overlay", type=click.Path(dir_okay=False), default=None,
              help="critical_path: also write the path as a Chrome trace JSON to this file.")
@click.option("--catalog", type=click.Path(exists=True, dir_okay=False), default=None,
              help="mfu, roofline: a device catalog TOML that adds or overrides devices (analyses/device_catalog.toml's form).")
@click.option("--device", default=None, metavar="NAME",
              help="mfu, roofline: the GPU every rank ran on, a device catalog name (e.g. H100-SXM), for a trace "
                   "without deviceProperties; it overrides what the trace names.")
@click.option("--ranks", "ranks_spec", default=None, metavar="SPEC",
              help="Per-rank analyses: only these ranks, e.g. 0-15,32 (the sample is said in the output).")
@click.option("--sample-ranks", type=int, default=None, metavar="N",
              help="Per-rank analyses: N ranks evenly spaced over the run (the sample is said in the output).")
@click.option("--executor", default=None, metavar="dask://HOST:PORT",
              help="Per-rank analyses: run the ranks in chunks on this Dask cluster (the store on a filesystem every "
                   "worker sees under the same path).")
@click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Any other parameter of the analysis (see its function's docstring), e.g. -p kernel_wait_threshold_ns=50000.")
@store_option()
@format_option()
@fail_cleanly
def analyze_cmd(name, trace_dir, list_, rank, step, by_step, drop_last_step, top_k, rules, against, against_store,
                overlay, catalog, device, ranks_spec, sample_ranks, executor, params, store, fmt):
    """Run analysis NAME over TRACE_DIR (ingesting new or changed traces first).

    \b
    Example:
      tracekit analyze --list
      tracekit analyze temporal_breakdown runs/job42/ --format json
      tracekit analyze comm_comp_overlap runs/job42/ --by-step
      tracekit analyze kernel_breakdown runs/job42/ --rank 0 --top-k 5
      tracekit analyze idle_time_breakdown runs/job42/ -p kernel_wait_threshold_ns=50000
      tracekit analyze trace_diff runs/base/ --against runs/new/
      tracekit analyze mfu runs/job42/ --by-step --catalog our_gpus.toml
      tracekit analyze roofline runs/job42/ --device H100-SXM
      tracekit analyze temporal_breakdown runs/job4096/ --sample-ranks 64
    """
    from analyses.registry import REGISTRY, check_params, run_analysis

    if list_:
        import pandas as pd

        emit(pd.DataFrame({"name": list(REGISTRY), "description": [a.description for a in REGISTRY.values()]}), fmt)
        return
    if not name or not trace_dir:
        raise TracekitError("NAME and TRACE_DIR are required (or --list)")
    given = {"rank": rank, "step": step, "by_step": by_step, "drop_last_step": drop_last_step, "top_k": top_k,
             "rules": rules, "overlay_path": overlay, "catalog": catalog, "device": device}
    kwargs = {k: v for k, v in given.items() if v is not None}
    raw = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep:
            raise TracekitError(f"--param {item!r}: expected KEY=VALUE")
        raw[key] = value

    def spell(key):  # the option that gave a parameter, for the library's error
        return f"--{key.replace('_', '-').replace('-path', '')}" if key in given else f"--param {key}"

    analysis = check_params(name, {**kwargs, **raw}, spell)
    for key, value in raw.items():
        kwargs[key] = _coerce(value, analysis.parameters[key], key)

    import tracekit

    run = tracekit.open(trace_dir, store)
    if analysis.needs_other_run:
        if against is None:
            raise TracekitError(f"--against: {name} needs the other trace directory to compare with")
        kwargs["other"] = tracekit.open(against, against_store)
    elif against is not None:
        raise TracekitError(f"--against: not an option of {name}")
    if ranks_spec is not None or sample_ranks is not None or executor is not None:
        from analyses import per_rank

        opt = "--ranks" if ranks_spec is not None else "--sample-ranks" if sample_ranks is not None else "--executor"
        if name not in per_rank.PER_RANK:
            raise TracekitError(f"{opt}: {name} is not a per-rank analysis (per-rank: "
                                f"{', '.join(sorted(per_rank.PER_RANK))})")
        if ranks_spec is not None and sample_ranks is not None:
            raise TracekitError("--ranks and --sample-ranks: give one of them")
        chosen = (per_rank.parse_ranks(ranks_spec, run.ranks) if ranks_spec is not None
                  else per_rank.sample_ranks(run.ranks, sample_ranks) if sample_ranks is not None else None)
        df = per_rank.run_per_rank(run, name, kwargs, ranks=chosen, executor=executor)
    else:
        df = run_analysis(run, name, **kwargs)
    emit_result(df, fmt)


def _coerce(raw: str, param: inspect.Parameter, key: str):
    """Type a --param value like the parameter's default (bool, int, float, else str)."""
    default = param.default
    try:
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1", "yes")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        raise TracekitError(f"--param {key}={raw}: expected {type(default).__name__}") from None
    return raw
