"""The device catalog (analyses/device_catalog.toml): dense peak TFLOP/s per dtype, memory GB/s and memory
capacity (GiB) per device, matched from the traces' deviceProperties names; a user's file of the same form adds
or overrides devices (--catalog FILE or TRACEKIT_DEVICE_CATALOG). An unknown device has null peaks, never a
guess; a trace that does not name its GPU (no deviceProperties) gets one only from the user (--device NAME).
Also the one definition of whether a memory peak fits a device (fit_verdict)."""
from __future__ import annotations

import json
import math
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import TracekitError

CATALOG = Path(__file__).with_name("device_catalog.toml")
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")
KEYS = {"match", "memory_gbps", "memory_gib", "host_link_gbps", "source", *DTYPES}
ENV = "TRACEKIT_DEVICE_CATALOG"


@dataclass(frozen=True)
class Device:
    name: str
    match: str
    peaks_tflops: dict  # dtype -> TFLOP/s (dense)
    memory_gbps: float | None
    source: str
    memory_gib: float | None = None  # capacity of one device (a rank's GPU), GiB
    host_link_gbps: float | None = None  # the device's link to its host's memory, one direction, GB/s

    def memory_capacity_bytes(self) -> int | None:
        return round(self.memory_gib * 2**30) if self.memory_gib is not None else None

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
        raise TracekitError(f"{where}: no [devices.<name>] tables; each device has match, source, memory_gbps, "
                            f"memory_gib and peaks among {', '.join(DTYPES)} (TFLOP/s)")
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
        for k in (*DTYPES, "memory_gbps", "memory_gib", "host_link_gbps"):
            v = d.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
                raise TracekitError(f"{where}: devices.{name}.{k}: {v!r} is not allowed; a positive number "
                                    "(TFLOP/s for a dtype, GB/s for memory_gbps and host_link_gbps, GiB for "
                                    "memory_gib), or leave it "
                                    "out when unknown")
        out[name] = Device(name, d["match"], {k: float(d[k]) for k in DTYPES if k in d},
                           float(d["memory_gbps"]) if "memory_gbps" in d else None, d["source"],
                           float(d["memory_gib"]) if "memory_gib" in d else None,
                           float(d["host_link_gbps"]) if "host_link_gbps" in d else None)
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


def memory_capacities(run, keys, device: str | None = None, devices=None) -> dict[tuple[int, int], tuple[int, str]]:
    """(rank, device_id) -> the memory capacity of that rank's device (memory_peak's device_id), bytes, and where
    the figure comes from; a key nothing knows the capacity of is left out. In this order: the trace's
    deviceProperties totalGlobalMem for that device (measured on the very device, so it wins over a datasheet);
    the catalog's memory_gib for the device the user names (device / --device: a trace that does not name its GPU,
    or a CPU run standing in for a GPU job, whose CPU memory, device_id -1, it then stands for); the catalog's for
    the device deviceProperties names. devices: a catalog file or a list of Devices, as catalog's argument."""
    devs = devices if isinstance(devices, list) else catalog(devices)
    given = given_device(device, devs) if device is not None else None
    props = device_properties(run)
    out = {}
    for rank, device_id in keys:
        entry = next((p for p in props.get(int(rank), []) if p.get("id") == device_id), None) \
            if device_id is not None and device_id >= 0 else None  # -1: the CPU, which deviceProperties do not list
        total = entry.get("totalGlobalMem") if entry else None
        if isinstance(total, (int, float)) and not isinstance(total, bool) and total > 0:
            out[(rank, device_id)] = (int(total), f"totalGlobalMem of the trace's {entry.get('name') or 'GPU'}")
            continue
        named = given if given is not None else match(entry.get("name") if entry else None, devs)
        cap = named.memory_capacity_bytes() if named is not None else None
        if cap:
            out[(rank, device_id)] = (cap, f"the device catalog's {named.name}")
    return out


# The share of a device's capacity a peak must leave free to count as fitting. The allocator's peak (what
# memory_peak and the memory what-if measure) is not all the device gives up: the CUDA context and the loaded
# kernels take several hundred MB before the first tensor, NCCL keeps its channel buffers outside the caching
# allocator (hundreds of MB more with many peers), and the caching allocator's fragmentation makes it reserve
# more than it hands out (reserved above allocated; an allocation fails when no free block is large enough,
# even with enough bytes free in total). 10% of an 80 GiB device is 8 GiB: room for all three on a training job
# without PYTORCH_CUDA_ALLOC_CONF tuning; a job that measured its own overhead sets its own (reserve_pct).
DEFAULT_MEMORY_RESERVE_PCT = 10.0


def fit_verdict(peak_bytes: float, capacity_bytes: float | None,
                reserve_pct: float = DEFAULT_MEMORY_RESERVE_PCT) -> tuple[bool | None, str | None]:
    """Whether a memory peak (the allocator's, bytes) fits a device of capacity_bytes: it fits when it leaves at
    least reserve_pct of the capacity free. fits is None when the capacity is unknown (no note: nothing to
    say); the note says why it does not fit: within the reserve (it would fit the bare capacity, with less free
    than the reserve) or above the capacity."""
    if not 0.0 <= reserve_pct < 100.0:
        raise ValueError(f"reserve_pct must be in [0, 100), got {reserve_pct!r}")
    if capacity_bytes is None:
        return None, None
    if capacity_bytes <= 0 or peak_bytes < 0:
        raise ValueError(f"a capacity > 0 and a peak >= 0 are needed, got {capacity_bytes!r} and {peak_bytes!r}")
    free = capacity_bytes - peak_bytes
    reserve = capacity_bytes * reserve_pct / 100.0
    if free >= reserve:
        return True, None
    cap_txt = f"the device's {gib(capacity_bytes)}"
    if free < 0:
        return False, f"does not fit: the peak {gib(peak_bytes)} is {gib(-free)} above {cap_txt}"
    return False, (f"within the reserve: the peak {gib(peak_bytes)} leaves {gib(free)} free of {cap_txt}, less "
                   f"than the {reserve_pct:g}% reserve ({gib(reserve)}) kept for the CUDA context, NCCL's buffers "
                   "and the allocator's fragmentation")


def gib(n_bytes: float) -> str:
    """A memory size as the fit notes and doctor's memory findings write it: in GiB, the catalog's unit, to
    three significant digits without an exponent (2 MiB against a small test device stays readable: 0.00195 GiB)."""
    v = n_bytes / 2**30
    return f"{v:.{max(0, 2 - math.floor(math.log10(abs(v))))}f} GiB" if v else "0 GiB"
