"""The device catalog (analyses/device_catalog.toml): dense peak TFLOP/s per dtype and memory GB/s per
device, matched from the traces' deviceProperties names; a user's file of the same form adds or overrides
devices (--catalog FILE or TRACEKIT_DEVICE_CATALOG). An unknown device has null peaks, never a guess; a trace
that does not name its GPU (no deviceProperties) gets one only from the user (--device NAME)."""
from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import TracekitError

CATALOG = Path(__file__).with_name("device_catalog.toml")
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")
KEYS = {"match", "memory_gbps", "source", *DTYPES}
ENV = "TRACEKIT_DEVICE_CATALOG"


@dataclass(frozen=True)
class Device:
    name: str
    match: str
    peaks_tflops: dict  # dtype -> TFLOP/s (dense)
    memory_gbps: float | None
    source: str

    def peak(self, dtype: str | None) -> float | None:
        return self.peaks_tflops.get(dtype) if dtype else None


def _read(path: Path) -> dict[str, Device]:
    where = str(path)
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as e:
        raise TracekitError(f"{where}: cannot read the device catalog: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise TracekitError(f"{where}: not valid TOML: {e}") from None
    devices = doc.get("devices")
    if not isinstance(devices, dict) or not devices:
        raise TracekitError(f"{where}: no [devices.<name>] tables; each device has match, source, memory_gbps "
                            f"and peaks among {', '.join(DTYPES)} (TFLOP/s)")
    out = {}
    for name, d in devices.items():
        if not isinstance(d, dict):
            raise TracekitError(f"{where}: devices.{name} must be a table")
        bad = sorted(set(d) - KEYS)
        if bad:
            raise TracekitError(f"{where}: devices.{name}.{bad[0]}: unknown key; allowed: {', '.join(sorted(KEYS))}")
        for k in ("match", "source"):
            if not isinstance(d.get(k), str) or not d.get(k):
                raise TracekitError(f"{where}: devices.{name}.{k}: a non-empty string is required")
        try:
            re.compile(d["match"])
        except re.error as e:
            raise TracekitError(f"{where}: devices.{name}.match: not a regular expression ({e})") from None
        for k in (*DTYPES, "memory_gbps"):
            v = d.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
                raise TracekitError(f"{where}: devices.{name}.{k}: {v!r} is not allowed; a positive number "
                                    "(TFLOP/s for a dtype, GB/s for memory_gbps), or leave it out when unknown")
        out[name] = Device(name, d["match"], {k: float(d[k]) for k in DTYPES if k in d},
                           float(d["memory_gbps"]) if "memory_gbps" in d else None, d["source"])
    return out


def catalog(user_file: str | None = None) -> list[Device]:
    """The catalog's devices in match order: the user's file (argument, else $TRACEKIT_DEVICE_CATALOG) first,
    then the bundled ones it does not override."""
    base = _read(CATALOG)
    path = user_file or os.environ.get(ENV)
    user = _read(Path(path)) if path else {}
    return list(user.values()) + [d for n, d in base.items() if n not in user]


def match(device_name: str | None, devices: list[Device]) -> Device | None:
    if not device_name:
        return None
    for d in devices:
        if re.search(d.match, device_name, re.IGNORECASE):
            return d
    return None


def resolve(name: str, devices: list[Device]) -> Device | None:
    """A catalog device by its name (case-insensitive), else the first whose match pattern the name fits."""
    for d in devices:
        if d.name.lower() == name.strip().lower():
            return d
    return match(name, devices)


def given_device(name: str, devices: list[Device]) -> Device:
    """The device a user names for a run whose trace does not (an analysis's `device`, the CLI's --device)."""
    d = resolve(name, devices)
    if d is None:
        raise TracekitError(f"--device {name!r}: not in the device catalog; one of: "
                            f"{', '.join(x.name for x in devices)} (or add it to a catalog file: --catalog FILE, or "
                            f"{ENV}=FILE)")
    return d


def device_properties(run) -> dict[int, list[dict]]:
    """rank -> the trace's deviceProperties entries ([] where the trace has none or they do not parse)."""
    out = {}
    props = run.sql("SELECT rank, device_properties_json FROM ranks")
    for r, js in zip(props["rank"], props.device_properties_json):
        try:
            p = json.loads(js or "[]")
        except ValueError:
            p = []
        out[int(r)] = [x for x in p if isinstance(x, dict)] if isinstance(p, list) else []
    return out
