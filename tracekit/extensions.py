"""Extension points of the core: what a Run offers that an upper layer provides (`run.analyze` from
the analyses, `run.plot` from the report), found without the core importing or naming those layers.

Each provider is an entry point in the `tracekit.extensions` group of an installed distribution
(tracekit's own are in pyproject.toml); the core looks a provider up by its name the first time it
is used. A new layer or a plugin offers a provider the same way.
"""
from __future__ import annotations

from importlib.metadata import entry_points

from .errors import TracekitError

GROUP = "tracekit.extensions"

_loaded: dict[str, object] = {}


def provider(name: str):
    """The object the `name` entry point of the tracekit.extensions group refers to."""
    if name not in _loaded:
        found = entry_points(group=GROUP, name=name)
        if not found:
            raise TracekitError(f"no {GROUP} entry point named {name!r} is installed: the installed tracekit "
                                "metadata is older than the code; reinstall it (pip install -e .)")
        _loaded[name] = next(iter(found)).load()
    return _loaded[name]
