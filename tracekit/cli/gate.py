"""`tracekit gate`: compare two runs metric by metric; exit 0 pass, 1 regression, 2 unusable input."""
from __future__ import annotations

import click

from ..errors import TracekitError
from ._common import emit, fail_cleanly, format_option


@click.command("gate")
@click.argument("baseline")
@click.argument("candidate")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="pyproject.toml with [tool.tracekit.gate], or a standalone TOML file "
                   "(default: ./pyproject.toml when it has that table, else built-in thresholds).")
@click.option("--baseline-store", type=click.Path(file_okay=False), default=None, help="Store directory for BASELINE.")
@click.option("--candidate-store", type=click.Path(file_okay=False), default=None, help="Store directory for CANDIDATE.")
@click.option("--prediction", is_flag=True,
              help="CANDIDATE is a prediction of BASELINE (a measured run): an error in either direction counts "
                   "against the threshold, the model's error budget.")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False), default=None,
              help="Also write a Markdown summary here (append it to $GITHUB_STEP_SUMMARY in CI).")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), default=None,
              help="Also write JUnit XML here: one test case per metric.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the full result (samples' medians, p-values, effect sizes) as JSON here.")
@format_option()
@fail_cleanly
def gate_cmd(baseline, candidate, config_path, baseline_store, candidate_store, prediction, markdown_path,
             junit_path, json_path, fmt):
    """Compare CANDIDATE against BASELINE (trace directories or stores, measured or replayed).

    A metric fails only when its change is over its threshold and significant (Mann-Whitney on the
    per-step samples). Exit code 0: pass; 1: regression; 2: unusable input or config.
    See docs/gate.md for the config keys and the statistics.

    \b
    Example:
      tracekit gate runs/main/ runs/pr123/
      tracekit gate runs/main/ runs/pr123/ --config gate.toml --markdown summary.md --junit gate.xml
      tracekit gate runs/measured/ runs/replayed/ --prediction
    """
    import tracekit
    from ..gate import compare, load_config
    from ..gate import render

    cfg = load_config(config_path)
    base_run = _open(tracekit, "BASELINE", baseline, baseline_store)
    cand_run = _open(tracekit, "CANDIDATE", candidate, candidate_store)
    result = compare(base_run, cand_run, cfg, prediction=prediction)
    if fmt == "json":
        click.echo(render.to_json(result))
    elif fmt == "csv":  # raw numbers, one column per field of the result (the unit in its own column)
        emit(result.table(), fmt)
    else:
        import pandas as pd

        emit(pd.DataFrame(render.summary_rows(result)), fmt)
        click.echo(f"\ngate: {render.verdict(result)} ({len(result.failed)} of {len(result.metrics)} metrics failed)")
    for path, option, text in ((markdown_path, "--markdown", lambda: render.markdown(result, baseline, candidate)),
                               (junit_path, "--junit", lambda: render.junit(result)),
                               (json_path, "--json", lambda: render.to_json(result) + "\n")):
        if path:
            _write(path, option, text())
    if not result.passed:
        raise click.exceptions.Exit(1)


def _open(tracekit, which: str, path: str, store: str | None):
    try:
        return tracekit.open(path, store)
    except TracekitError as e:
        raise TracekitError(f"{which} {e}") from None


def _write(path: str, option: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise TracekitError(f"{option} {path}: cannot write ({e.strerror}); pass a writable file path") from None
