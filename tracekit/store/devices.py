"""Which trace events are device ops, and which are the host runtime calls that launch them.

The one declarative map every reader of the store takes this from: the store's views (gpu_ops, kernels,
runtime), ingest's per-file derived tables (steps' GPU spans, gpu_args), the analyses' shared helpers,
`tracekit info` and the replay. Kineto names an event's category after the profiler activity that
recorded it, so each accelerator family brings its own names; a device op keeps its category in the
store, and this map says what it is (kernel, memcpy or memset). A kernel's name then decides its class
(analyses/kernel_classes.py): MTIA records kernels and DMA copies under one category.

On a connection the map is two SQL macros (installed before the views):
    device_op_kind(cat)      'kernel' | 'memcpy' | 'memset' for a device op's category, else NULL
    is_device_op(cat)        true for a device op's category (NULL for a NULL category)
    is_device_runtime(cat)   true for a runtime/driver call's category (the launches of device ops; NULL for NULL)
    is_device_lane_marker(cat)  true for a category on device lanes that is no device op (cuda_sync, ...)
"""
from __future__ import annotations

from .sql import literal

# category -> kind of device op
DEVICE_OP_KINDS: dict[str, str] = {
    # CUDA (CUPTI), ROCm (roctracer, HIP ops recorded as CUDA's activities) and Intel XPU (XPUPTI):
    # Kineto's CONCURRENT_KERNEL, GPU_MEMCPY and GPU_MEMSET activities
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    # MTIA: every on-device op (kernels and DMA) is an MTIA_CCP_EVENTS activity; its name tells them apart
    "mtia_ccp_events": "kernel",
    # the spellings older exporters and converters use (HTA accepts them too)
    "Kernel": "kernel",
    "Memcpy": "memcpy",
    "Memset": "memset",
}

# categories of host calls that launch device ops or wait for them (their correlation ids pair them)
RUNTIME_CATEGORIES: tuple[str, ...] = (
    "cuda_runtime", "cuda_driver",  # CUDA; ROCm's HIP calls are recorded under these too
    "mtia_runtime",  # MTIA
    "xpu_runtime", "xpu_driver",  # Intel XPU
    "privateuse1_runtime", "privateuse1_driver",  # out-of-tree backends (PrivateUse1: Gaudi, NPUs, ...)
)

# categories that sit on device lanes, and may start where a launch flow ends, without being device ops:
# CUDA's sync markers and the GPU mirror of user annotations
DEVICE_LANE_MARKERS: tuple[str, ...] = ("cuda_sync", "gpu_user_annotation")

DEVICE_OP_CATEGORIES: tuple[str, ...] = tuple(DEVICE_OP_KINDS)


def sql_in(categories) -> str:
    """A category list for `cat IN (...)` where SQL text is built outside a connection with the macros
    (ingest's derived tables, the replay writer): constants of this module, quoted."""
    return "(" + ", ".join(literal(c) for c in categories) + ")"


def macros_sql() -> list[str]:
    """The statements that install the macros on a connection. The tests are bare `cat IN (...)` lists: DuckDB
    pushes such a filter into the Parquet scan (a CASE or coalesce around it is evaluated on every row, twice
    the time of a scan of 4,096 ranks' events)."""
    cases = " ".join(f"WHEN {literal(c)} THEN {literal(k)}" for c, k in DEVICE_OP_KINDS.items())
    return [f"CREATE OR REPLACE MACRO device_op_kind(cat) AS CASE cat {cases} END",
            f"CREATE OR REPLACE MACRO is_device_op(cat) AS (cat IN {sql_in(DEVICE_OP_CATEGORIES)})",
            f"CREATE OR REPLACE MACRO is_device_runtime(cat) AS (cat IN {sql_in(RUNTIME_CATEGORIES)})",
            f"CREATE OR REPLACE MACRO is_device_lane_marker(cat) AS (cat IN {sql_in(DEVICE_LANE_MARKERS)})"]
