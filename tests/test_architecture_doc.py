"""docs/architecture.md names every module of the tree: a module added without a line there fails here."""
from __future__ import annotations

import re

from .conftest import REPO

PACKAGES = ("tracekit", "analyses", "replay")


def test_every_module_is_named_in_the_architecture_doc():
    doc = re.sub(r"```.*?```", "", (REPO / "docs" / "architecture.md").read_text(), flags=re.S)  # the diagram
    named = set(re.findall(r"`([^`]+)`", doc))
    words = {w for n in named for w in re.split(r"[\s,()/]+", n)}  # `kernel_classes.py`, `a.b`, `x` ...
    missing = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*")):
            if path.suffix not in (".py", ".c") or "__pycache__" in path.parts or path.name == "__init__.py":
                continue
            if path.name not in words and path.stem not in words:
                missing.append(str(path.relative_to(REPO)))
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"
