"""The scenario validator: value checks, the walk of a parsed document against a schema, and the
one-line error that names the file, the key as `[section] key` and what is allowed.

A schema maps each key to a rule: a check (a function returning the value, normalised, or raising
Bad with what is allowed), a dict (a sub-table), ("array", {...}) (an array of tables) or ("map",
key_check, value_check) (a table of free keys). replay/specs.py derives the scenario's schema from
its typed specs; nothing here knows what a scenario contains.
"""
from __future__ import annotations

import math
import re

from tracekit.errors import TracekitError


class ScenarioError(TracekitError):
    """A scenario file that cannot be used. The message is one line naming the file and the key."""


class Bad(Exception):
    """A value a check refuses; the message says what is allowed."""


# ---------------------------------------------------------------------------------------------------
# Value checks


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def positive(v):
    if not _is_num(v) or not math.isfinite(v) or v <= 0:
        raise Bad("must be a number > 0")
    return float(v)


def non_negative(v):
    if not _is_num(v) or not math.isfinite(v) or v < 0:
        raise Bad("must be a number >= 0")
    return float(v)


def fraction(v):
    if not _is_num(v) or not (0 <= v <= 1):
        raise Bad("must be a number in [0, 1]")
    return float(v)


def percent(v):
    if not _is_num(v) or not (0 <= v < 100):
        raise Bad("must be a number in [0, 100)")
    return float(v)


def boolean(v):
    if not isinstance(v, bool):
        raise Bad("must be true or false")
    return v


def int_at_least(lo):
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise Bad(f"must be an integer >= {lo}")
        return v
    return check


def one_of(*allowed):
    def check(v):
        if v not in allowed or not isinstance(v, str):
            raise Bad(f"must be one of: {', '.join(allowed)}")
        return v
    return check


def text(v):
    if not isinstance(v, str):
        raise Bad("must be a string")
    return v


def regex(v):
    if not isinstance(v, str):
        raise Bad("must be a string (a regular expression)")
    try:
        re.compile(v)
    except re.error as e:
        raise Bad(f"is not a valid regular expression ({e})") from None
    return v


def globs(v):
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
        return list(v)
    raise Bad("must be a glob or a non-empty list of globs")


def ordinals(v):
    if (not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v)
            or v[0] < 0 or v[0] > v[1]):
        raise Bad("must be [start, stop) with 0 <= start <= stop, integers")
    return v


def interval(v):
    if v == "optimal":
        return None
    if not _is_num(v) or not math.isfinite(v) or v <= 0:
        raise Bad('must be a number of seconds > 0 or "optimal"')
    return float(v)


def rank_key(k):
    try:
        r = int(k)
    except (TypeError, ValueError):
        raise Bad("rank must be an integer >= 0") from None
    if isinstance(k, bool) or r < 0 or (isinstance(k, str) and k.strip() != str(r)):
        raise Bad("rank must be an integer >= 0")
    return r


def rank_list(v):
    """[1] or [0, 2]: ranks, each once."""
    if (not isinstance(v, list) or not v
            or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in v) or len(set(v)) != len(v)):
        raise Bad("must be a non-empty list of distinct ranks (integers >= 0), e.g. [1]")
    return tuple(v)


def rank_groups(v):
    """[[0, 1], [2, 3]]: ranks grouped by host, each rank once."""
    if (not isinstance(v, list) or not v or not all(
            isinstance(g, list) and g and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in g)
            for g in v)):
        raise Bad("must be a non-empty list of non-empty lists of ranks (integers >= 0), one list per host, "
                  "e.g. [[0, 1], [2, 3]]")
    seen: set[int] = set()
    for g in v:
        for r in g:
            if r in seen:
                raise Bad(f"names rank {r} twice; each rank runs on one host")
            seen.add(r)
    return tuple(tuple(g) for g in v)


# ---------------------------------------------------------------------------------------------------
# The walk


def where(path: tuple) -> str:
    """`[network.links] inter_node`-style location of a key."""
    *table, key = path
    if not table:
        return str(key)
    table = [str(t) for t in table]
    if " #" in table[-1]:  # an element of an array of tables
        name, idx = table[-1].split(" #")
        return f"[[{'.'.join(table[:-1] + [name])}]] #{idx} {key}"
    return f"[{'.'.join(table)}] {key}"


def failer(source: str):
    """fail(path, what): raise the ScenarioError of `source` for the key at path."""
    def fail(path: tuple, what: str):
        raise ScenarioError(f"{source}: {where(path)}: {what}" if path else f"{source}: {what}")
    return fail


def validate(doc, schema: dict, path: tuple, fail) -> dict:
    """The document with every value checked and normalised; the first bad key calls fail."""
    if not isinstance(doc, dict):
        fail(path, "must be a table")
    out = {}
    for key, value in doc.items():
        if key not in schema:
            fail(path + (key,), f"unknown key; allowed: {', '.join(schema)}")
        rule = schema[key]
        here = path + (key,)
        if isinstance(rule, dict):
            out[key] = validate(value, rule, here, fail)
        elif isinstance(rule, tuple) and rule[0] == "array":
            if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
                fail(here, "must be an array of tables ([[...]])")
            out[key] = [validate(item, rule[1], path + (f"{key} #{i}",), fail) for i, item in enumerate(value, 1)]
        elif isinstance(rule, tuple) and rule[0] == "map":
            if not isinstance(value, dict):
                fail(here, "must be a table")
            m = {}
            for k, v in value.items():
                try:
                    kk = rule[1](k)
                except Bad as e:
                    fail(here + (k,), str(e))
                try:
                    m[kk] = rule[2](v)
                except Bad as e:
                    fail(here + (k,), str(e))
            out[key] = m
        else:
            try:
                out[key] = rule(value)
            except Bad as e:
                fail(here, str(e))
    return out
