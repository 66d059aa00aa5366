"""Layering as a checked rule: core < analyses < replay < app. A module may import its own layer and
the layers below it, never one above (the core reaches the analyses and the report only through
tracekit.extensions). Every import counts: top level and inside functions, relative ones resolved."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import REPO

PACKAGES = ("tracekit", "analyses", "replay")
LAYERS = ("core", "analyses", "replay", "app")

# The layer of every top-level module and subpackage; the longest matching prefix wins.
LAYER_OF = {
    "tracekit": "core",             # the package itself: tracekit.open, the errors, the version
    "tracekit.errors": "core",
    "tracekit.store": "core",
    "tracekit.ingest": "core",
    "tracekit.run": "core",
    "tracekit.capture": "core",     # writes what ingest reads; runs inside the training job
    "tracekit.testbed": "core",     # network namespaces capture runs in
    "tracekit.info": "core",        # run.info(): counts straight from the store
    "tracekit.extensions": "core",  # where the core finds what upper layers provide
    "analyses": "analyses",
    "replay": "replay",
    "tracekit.cli": "app",
    "tracekit.report": "app",
    "tracekit.gate": "app",
    "tracekit.advice": "app",       # doctor: the analyses' evidence, the replay's savings
    "tracekit.output": "app",       # the CLI's and the gate's output contract
}

def layer(module: str) -> str | None:
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in LAYER_OF:
            return LAYER_OF[".".join(parts[:i])]
    return None


def _modules(root: Path = REPO):
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield ".".join(parts), path


def _is_module(name: str, root: Path = REPO) -> bool:
    p = root.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imports(module: str, path: Path, root: Path = REPO):
    """(line, imported module) for every import in the file, relative ones resolved against module (the
    packages under root)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                # `from . import x` imports the module x when there is one, else a name of base
                yield node.lineno, sub if _is_module(sub, root) else base


def upward_imports(root: Path = REPO):
    for module, path in _modules(root):
        mine = layer(module)
        for line, target in imports(module, path, root):
            theirs = layer(target)
            if theirs is None or mine is None:
                continue
            if LAYERS.index(theirs) > LAYERS.index(mine):
                yield module, path, line, target, mine, theirs


def test_every_module_has_a_layer():
    assert [m for m, _ in _modules() if layer(m) is None] == []


def test_imports_run_one_way():
    found = [f"{path.relative_to(REPO)}:{line}: {module} ({mine}) imports {target} ({theirs}): "
             f"{mine} may not import {theirs} (layers: {' < '.join(LAYERS)})"
             for module, path, line, target, mine, theirs in upward_imports()]
    assert found == [], "\n".join(found)


def test_an_upward_import_is_found(tmp_path):
    # the check above passes on an empty list: here it must find each kind of upward import in a tree made for it
    files = {"tracekit/__init__.py": "",
             "tracekit/store/__init__.py": "",
             "tracekit/store/a.py": "import replay.engine\n",                   # core -> replay, absolute
             "tracekit/ingest/__init__.py": "",
             "tracekit/ingest/b.py": "def f():\n    from ..cli import x\n",    # core -> app, relative, in a function
             "tracekit/cli/__init__.py": "",
             "tracekit/cli/x.py": "from replay import engine\n",               # app -> replay: allowed
             "analyses/__init__.py": "",
             "analyses/c.py": "from replay.engine import simulate\n",          # analyses -> replay
             "replay/__init__.py": "",
             "replay/engine.py": "from analyses import c\n"}                   # replay -> analyses: allowed
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = sorted((module, target, mine, theirs) for module, _, _, target, mine, theirs in upward_imports(tmp_path))
    assert found == [("analyses.c", "replay.engine", "analyses", "replay"),
                     ("tracekit.ingest.b", "tracekit.cli.x", "core", "app"),
                     ("tracekit.store.a", "replay.engine", "core", "replay")]


@pytest.mark.parametrize("source, expected", [
    ("from ..gate import render\n", "tracekit.gate.render"),
    ("from .. import output\n", "tracekit.output"),
    ("from ..errors import TracekitError\n", "tracekit.errors"),
    ("def f():\n    from analyses.registry import run_analysis\n", "analyses.registry"),
])
def test_relative_and_function_level_imports_are_resolved(tmp_path, source, expected):
    path = tmp_path / "x.py"
    path.write_text(source)
    assert [t for _, t in imports("tracekit.cli.x", path)] == [expected]


def test_core_reaches_upper_layers_through_extension_points():
    # run.analyze and run.plot: the providers come from installed metadata, not from an import
    from tracekit.extensions import provider

    from analyses.registry import run_analysis
    from tracekit.report.accessor import PlotAccessor

    assert provider("analyze") is run_analysis and provider("plot") is PlotAccessor
