"""FLOPs and bytes per operator from the recorded shapes, achieved TFLOP/s and GB/s of the kernels each
launched, MFU per rank and step, and a roofline per operator kind.

Conventions are torch/utils/flop_counter.py's (FlopCounterMode): GEMM 2*M*N*K (addmm's bias not
counted), bmm / baddbmm 2*B*M*N*K, convolution prod(out spatial) * prod(kernel) * N * C_out * C_in/groups *
2 and its backward per computed gradient, scaled-dot-product attention 2*b*h*s_q*s_k*(d_q + d_v) forward and
its five-GEMM backward; memory-bound ops (elementwise, norms, softmax, copies) have no FLOPs and move their
inputs' bytes plus one output the size of the largest input. FlopCounterMode has no formula for the CPU
attention kernels (`aten::_scaled_dot_product_flash_attention_for_cpu` and its backward): they are counted
by the GPU variants' formula, as class attention.

Only the leaf operator counts: an op of the table whose descendants on its thread include another op of
the table (aten::linear -> aten::addmm, aten::matmul -> aten::mm, aten::convolution -> aten::_convolution)
leaves the count to them, never a parent and its child twice. An op of the table without recorded shapes
(profiled without record_shapes) is unknown: counted as such and said in the note, never guessed.

The arithmetic on shapes is Python (Input Dims are lists of lists); the sums per class, rank and step
are the frames' group-bys below.
"""
from __future__ import annotations

import json
from math import prod

import numpy as np
import pandas as pd

from ._sql import with_note
from .devices import catalog, device_properties, given_device, match
from .steps import median_steps

ELEM_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "long": 8, "int": 4,
              "short int": 2, "short": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
              "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
              "c10::complex<float>": 8, "c10::complex<double>": 16}
DTYPE_OF = {"float": "fp32", "double": "fp64", "c10::Half": "fp16", "c10::BFloat16": "bf16",
            "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
            "c10::Float8_e5m2fnuz": "fp8"}


def _gemm(d, c):  # mm(a, b)
    (m, k), (_k2, n) = d[0], d[1]
    return 2 * m * n * k


def _addmm(d, c):  # addmm(bias, a, b)
    (m, k), (_k2, n) = d[1], d[2]
    return 2 * m * n * k


def _bmm(d, c):
    (b, m, k), (_b, _k, n) = d[0], d[1]
    return 2 * b * m * n * k


def _baddbmm(d, c):
    (b, m, k), (_b, _k, n) = d[1], d[2]
    return 2 * b * m * n * k


def _matmul_like(a, b):
    """aten::matmul / aten::linear without a GEMM child: batch dims of a times the GEMM of the last two."""
    if len(a) == 1:
        a = [1, *a]
    k = a[-1]
    n = b[-1] if len(b) > 1 else 1
    return 2 * prod(a[:-1]) * k * n * (prod(b[:-2]) if len(b) > 2 and len(a) <= 2 else 1)


def _matmul(d, c):
    return _matmul_like(d[0], d[1])


def _linear(d, c):  # linear(input, weight[N, K], bias)
    x, w = d[0], d[1]
    return 2 * prod(x[:-1]) * x[-1] * w[0]


def _ints(v):
    """A Concrete Inputs entry ('[1, 1]', '1', 'False') as a list of ints, or a bool / int."""
    if v in ("", None):
        return None
    try:
        return json.loads(v.replace("True", "true").replace("False", "false"))
    except ValueError:
        return None


def _conv_out(x, w, stride, padding, dilation, transposed, output_padding):
    sp = []
    nd = len(x) - 2
    stride, padding, dilation = (_expand(v, nd) for v in (stride, padding, dilation))
    output_padding = _expand(output_padding if output_padding is not None else 0, nd)
    for i in range(nd):
        k = w[2 + i]
        if transposed:
            sp.append((x[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (k - 1) + output_padding[i] + 1)
        else:
            sp.append((x[2 + i] + 2 * padding[i] - dilation[i] * (k - 1) - 1) // stride[i] + 1)
    return sp


def _expand(v, n):
    if v is None:
        return [1] * n
    if isinstance(v, int):
        return [v] * n
    return list(v) * n if len(v) == 1 else list(v)


def _conv_count(x, w, out_sp, transposed):  # flop_counter.conv_flop_count
    conv_sp = x[2:] if transposed else out_sp
    c_out, c_in, *filt = w
    return prod(conv_sp) * prod(filt) * x[0] * c_out * c_in * 2


def _convolution(d, c):  # convolution / _convolution(input, weight, bias, stride, padding, dilation, transposed, ...)
    x, w = d[0], d[1]
    stride, padding, dilation, transposed = _ints(c[3]), _ints(c[4]), _ints(c[5]), bool(_ints(c[6]))
    out_pad = _ints(c[7]) if len(c) > 7 else None
    return _conv_count(x, w, _conv_out(x, w, stride, padding, dilation, transposed, out_pad), transposed)


def _conv_positional(order):
    """cudnn / mkldnn convolutions: (input, weight, [bias,] padding, stride, dilation, ...) in their order."""
    def f(d, c):
        x, w = d[0], d[1]
        v = {k: _ints(c[i]) for k, i in order.items()}
        return _conv_count(x, w, _conv_out(x, w, v["stride"], v["padding"], v["dilation"], False, None), False)
    return f


def _conv_backward(d, c):
    # convolution_backward(grad_out, input, weight, bias_sizes, stride, padding, dilation, transposed,
    # output_padding, groups, output_mask)
    g, x, w = d[0], d[1], d[2]
    transposed = bool(_ints(c[7]))
    mask = _ints(c[10]) or [True, True, False]

    def t(s):
        return [s[1], s[0], *s[2:]]
    flops = 0
    if mask[0]:
        flops += _conv_count(g, w, x[2:], not transposed)
    if mask[1]:
        if transposed:
            flops += _conv_count(t(g), t(x), t(w)[2:], False)
        else:
            flops += _conv_count(t(x), t(g), t(w)[2:], False)
    return flops


def _sdpa(d, c):  # (query, key, value, ...): 2 GEMMs
    (b, h, sq, dq), (_b, _hk, sk, _d), (_b3, _h3, _s3, dv) = d[0], d[1], d[2]
    return 2 * b * h * sq * sk * dq + 2 * b * h * sq * sk * dv


def _sdpa_backward(d, c):  # (grad_out, query, key, value, ...): 5 GEMMs
    (b, h, sq, dq), (_b, _hk, sk, _d), (_b3, _h3, _s3, dv) = d[1], d[2], d[3]
    bh = b * h
    return 2 * bh * (sq * dq * sk + sq * dv * sk + sk * sq * dv + sq * sk * dq + dq * sq * sk)


def _flash_forward(d, c):  # _flash_attention_forward / _efficient_attention_forward: (b, s, h, d) layout
    (b, sq, h, dq), (_b, sk, _h, _d), (_b3, _s3, _h3, dv) = d[0], d[1], d[2]
    return 2 * b * h * sq * sk * (dq + dv)


def _flash_backward(d, c):  # (grad_out, query, key, value, ...) in (b, s, h, d)
    (b, sq, h, dq), (_b, sk, _h, _d), (_b3, _s3, _h3, dv) = d[1], d[2], d[3]
    bh = b * h
    return 2 * bh * (sq * dq * sk + sq * dv * sk + sk * sq * dv + sq * sk * dq + dq * sq * sk)


GEMM = {"aten::mm": _gemm, "aten::addmm": _addmm, "aten::bmm": _bmm, "aten::baddbmm": _baddbmm,
        "aten::matmul": _matmul, "aten::linear": _linear}
CONV = {"aten::convolution": _convolution, "aten::_convolution": _convolution,
        "aten::cudnn_convolution": _conv_positional({"padding": 2, "stride": 3, "dilation": 4}),
        "aten::mkldnn_convolution": _conv_positional({"padding": 3, "stride": 4, "dilation": 5}),
        "aten::miopen_convolution": _conv_positional({"padding": 3, "stride": 4, "dilation": 5}),
        "aten::convolution_backward": _conv_backward}
ATTENTION = {**{f"aten::_scaled_dot_product_{v}_attention": _sdpa for v in ("flash", "efficient", "cudnn")},
             **{f"aten::_scaled_dot_product_{v}_attention_backward": _sdpa_backward
                for v in ("flash", "efficient", "cudnn")},
             "aten::_scaled_dot_product_flash_attention_for_cpu": _sdpa,
             "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_backward,
             "aten::_flash_attention_forward": _flash_forward, "aten::_efficient_attention_forward": _flash_forward,
             "aten::_flash_attention_backward": _flash_backward, "aten::_efficient_attention_backward": _flash_backward}
FORMULAS = {**{k: ("gemm", f) for k, f in GEMM.items()}, **{k: ("conv", f) for k, f in CONV.items()},
            **{k: ("attention", f) for k, f in ATTENTION.items()}}
# memory-bound ops: no FLOPs by FlopCounterMode's convention, their bytes moved
ELEMENTWISE = ("aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul", "aten::mul_", "aten::div",
               "aten::div_", "aten::addcmul_", "aten::addcdiv_", "aten::lerp_", "aten::sqrt", "aten::rsqrt",
               "aten::exp", "aten::gelu", "aten::gelu_backward", "aten::relu", "aten::relu_", "aten::threshold_backward",
               "aten::silu", "aten::silu_backward", "aten::tanh", "aten::sigmoid", "aten::neg", "aten::pow",
               "aten::copy_", "aten::clone", "aten::fill_", "aten::zero_", "aten::where", "aten::masked_fill",
               "aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::layer_norm",
               "aten::_softmax", "aten::_softmax_backward_data", "aten::softmax", "aten::_log_softmax",
               "aten::_log_softmax_backward_data", "aten::native_dropout", "aten::native_dropout_backward",
               "aten::sum", "aten::mean", "aten::embedding", "aten::embedding_dense_backward",
               "aten::native_batch_norm", "aten::native_batch_norm_backward", "aten::_foreach_add_",
               "aten::_foreach_mul_", "aten::_foreach_addcdiv_", "aten::_foreach_addcmul_", "aten::_foreach_lerp_",
               "aten::_foreach_sqrt", "aten::_foreach_div_")
KNOWN = set(FORMULAS) | set(ELEMENTWISE)

OP_COLUMNS = {"rank": "global rank", "event_id": "the op's event", "pid": "process", "tid": "thread", "name": "operator", "op_class":
              "gemm | conv | attention | elementwise | other", "flops": "FLOPs (NULL: shapes not recorded)",
              "bytes": "bytes read and written (NULL: shapes not recorded)", "dtype": "fp32 | fp16 | bf16 | ...",
              "ts_ns": "op start", "dur_ns": "op duration", "kernel_ns": "GPU time of the kernels it launched (NULL: none)"}

FLOPS_BY_OP_COLUMNS = {
    "op_class": "gemm | conv | attention | elementwise | other",
    "name": "leaf operator",
    "count": "calls",
    "flops": "FLOPs over the calls (NULL: no call recorded its shapes)",
    "bytes": "bytes read and written over the calls",
    "kernel_ns": "GPU time of the kernels the calls launched, ns (NULL: no kernels: a CPU run)",
    "achieved_tflops": "flops / kernel_ns / 1e3 (NULL without kernels)",
    "achieved_gbps": "bytes / kernel_ns (NULL without kernels)",
    "unknown_count": "calls without recorded shapes (not counted, never guessed)",
}
MFU_COLUMNS = {
    "rank": "global rank", "step": "ProfilerStep#N (by_step), NULL for the median over steps",
    "flops": "model FLOPs per step (leaf ops with shapes)", "step_ns": "step time, ns (median with by_step off)",
    "achieved_tflops": "flops / step_ns / 1e3",
    "device": "catalog device: the trace's deviceProperties, or the one given (device / --device); NULL: not in the "
              "catalog, not named by the trace (the note says so), or a CPU run",
    "dtype": "dtype of most of the FLOPs", "peak_tflops": "the device's dense peak for that dtype (NULL: unknown)",
    "mfu_pct": "100 * achieved / peak (NULL where the peak is unknown)",
}
ROOFLINE_COLUMNS = {
    "rank": "global rank", "op_class": "gemm | conv | attention | elementwise | other",
    "flops": "FLOPs", "bytes": "bytes read and written", "kernel_ns": "GPU time of their kernels, ns",
    "intensity_flop_per_byte": "flops / bytes", "achieved_tflops": "flops / kernel_ns / 1e3",
    "achieved_gbps": "bytes / kernel_ns", "bound": "compute | memory: which roofline term binds at that intensity",
    "attainable_tflops": "min(peak, intensity x memory bandwidth), TFLOP/s",
    "share_pct": "achieved / attainable (compute-bound) or achieved_gbps / memory bandwidth (memory-bound), percent",
    "device": "catalog device, as mfu's", "dtype": "dtype of most of the FLOPs",
}


def _parse(s):
    if not isinstance(s, str) or not s:
        return None
    try:
        return json.loads(s)
    except ValueError:
        return None


def _tensor_bytes(dims, types):
    total = 0
    for d, t in zip(dims or [], types or []):
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            total += prod(d) * ELEM_BYTES.get(t, 4)
        elif isinstance(d, list) and not d and t in ELEM_BYTES:
            total += ELEM_BYTES[t]  # a 0-dim tensor
    return total


def _largest(dims, types):
    best = 0
    for d, t in zip(dims or [], types or []):
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            best = max(best, prod(d) * ELEM_BYTES.get(t, 4))
    return best


def _leaf_ops(run) -> pd.DataFrame:
    """The ops of the table (FORMULAS, ELEMENTWISE) with no other op of the table below them on their thread."""
    names = ", ".join("'" + n.replace("'", "''") + "'" for n in sorted(KNOWN))
    df = run.sql(f"""SELECT rank, event_id, pid, tid, name, ts_ns, dur_ns, input_dims, input_types, concrete_inputs
                     FROM cpu_ops WHERE name IN ({names}) AND dur_ns IS NOT NULL
                     ORDER BY rank, pid, tid, ts_ns, dur_ns DESC""")
    if df.empty:
        return df
    end = (df.ts_ns + df.dur_ns).to_numpy(np.int64)
    ts = df.ts_ns.to_numpy(np.int64)
    is_flop = df.name.isin(list(FORMULAS)).to_numpy()
    key = list(zip(df["rank"], df.pid, df.tid))
    flop_below = np.zeros(len(df), bool)  # a FLOP op of the table among its descendants
    any_below = np.zeros(len(df), bool)   # any op of the table among its descendants
    flop_above = np.zeros(len(df), bool)  # inside a FLOP op of the table
    stack: list[int] = []  # the ops still open at the current one's start, outermost first
    for i in range(len(df)):
        if i and key[i] != key[i - 1]:
            stack = []
        while stack and end[stack[-1]] <= ts[i]:
            stack.pop()
        for j in stack:
            any_below[j] = True
            flop_below[j] |= is_flop[i]
            flop_above[i] |= is_flop[j]
        stack.append(i)
    # a FLOP op counts unless a FLOP op below it does (linear -> addmm); a memory-bound op counts unless an op
    # of the table below it does, or it is part of a FLOP op's work (the copy_ inside an addmm)
    keep = np.where(is_flop, ~flop_below, ~any_below & ~flop_above)
    return df[keep].reset_index(drop=True)


def op_table(run) -> pd.DataFrame:
    """One row per leaf op of the table: OP_COLUMNS."""
    return op_table_with_kernels(run)[0]


def op_table_with_kernels(run) -> tuple[pd.DataFrame, pd.DataFrame]:
    """op_table(run), and the kernels its ops launched (launched_kernels of every op: the join runs once)."""
    df = _leaf_ops(run)
    if df.empty:
        return pd.DataFrame(columns=list(OP_COLUMNS)), launched_kernels(run, df)
    cls, flops, nbytes, dtype = [], [], [], []
    for name, dims_s, types_s, conc_s in zip(df.name, df.input_dims, df.input_types, df.concrete_inputs):
        dims, types, conc = _parse(dims_s), _parse(types_s), _parse(conc_s) or []
        c, f = FORMULAS.get(name, ("elementwise", None))
        cls.append(c)
        if not dims:
            flops.append(None), nbytes.append(None), dtype.append(None)
            continue
        conc = list(conc) + [""] * (16 - len(conc))
        try:
            fl = int(f(dims, conc)) if f is not None else 0
        except (TypeError, ValueError, IndexError):
            fl = None  # shapes the formula cannot read: unknown, not guessed
        flops.append(fl)
        if c == "elementwise":
            nbytes.append(_tensor_bytes(dims, types) + _largest(dims, types))
        elif c == "gemm" and fl is not None:
            # inputs read, the output written: M x N of the GEMM's dtype
            t = next((x for x in types or [] if x in ELEM_BYTES), "float")
            nbytes.append(_tensor_bytes(dims, types) + _gemm_out(name, dims) * ELEM_BYTES[t])
        else:
            nbytes.append(_tensor_bytes(dims, types) + _largest(dims, types))
        dtype.append(next((DTYPE_OF[x] for x in types or [] if x in DTYPE_OF), None))
    out = df[["rank", "event_id", "pid", "tid", "name", "ts_ns", "dur_ns"]].copy()
    out["op_class"] = cls
    out["flops"] = pd.array(flops, dtype="Int64")
    out["bytes"] = pd.array(nbytes, dtype="Int64")
    out["dtype"] = dtype
    kern = launched_kernels(run, df)
    out["kernel_ns"] = _kernel_ns(kern, df)
    return out[list(OP_COLUMNS)], kern


def _gemm_out(name, dims):
    try:
        if name in ("aten::mm",):
            return dims[0][0] * dims[1][1]
        if name == "aten::addmm":
            return dims[1][0] * dims[2][1]
        if name == "aten::bmm":
            return dims[0][0] * dims[0][1] * dims[1][2]
        if name == "aten::baddbmm":
            return dims[1][0] * dims[1][1] * dims[2][2]
        if name == "aten::linear":
            return prod(dims[0][:-1]) * dims[1][0]
        return prod(dims[0][:-1]) * dims[1][-1]
    except (IndexError, TypeError):
        return 0


def launched_kernels(run, ops: pd.DataFrame) -> pd.DataFrame:
    """The kernels each op (rank, event_id, pid, tid, ts_ns, dur_ns) launched: runtime launches on its thread
    inside it, joined to the kernels by correlation. Columns rank, event_id (the op's), kernel_event_id, name,
    dur_ns."""
    if not len(ops) or not run.sql("SELECT count(*) AS n FROM kernels").n.iloc[0]:
        return pd.DataFrame(columns=["rank", "event_id", "kernel_event_id", "name", "dur_ns"])
    run.con.register("_flop_ops", ops[["rank", "event_id", "pid", "tid", "ts_ns", "dur_ns"]])
    try:
        return run.sql("""SELECT o.rank, o.event_id, k.event_id AS kernel_event_id, k.name, k.dur_ns
                          FROM _flop_ops o
                          JOIN runtime r ON r.rank = o.rank AND r.pid = o.pid AND r.tid = o.tid
                               AND r.ts_ns >= o.ts_ns AND r.ts_ns < o.ts_ns + o.dur_ns
                          JOIN kernels k ON k.rank = r.rank AND k.correlation = r.correlation""")
    finally:
        run.con.unregister("_flop_ops")


def _kernel_ns(kern: pd.DataFrame, ops: pd.DataFrame) -> pd.array:
    """GPU time of the kernels each op launched (kern: launched_kernels of ops; NULL: none)."""
    k = kern.groupby(["rank", "event_id"], as_index=False).dur_ns.sum()
    m = ops[["rank", "event_id"]].merge(k.rename(columns={"dur_ns": "kernel_ns"}), on=["rank", "event_id"], how="left")
    return pd.array(m.kernel_ns.to_numpy(dtype="float64"), dtype="Float64").round().astype("Int64")


def _note_unknown(ops: pd.DataFrame) -> str:
    n = int(ops.flops.isna().sum()) if len(ops) else 0
    if not n:
        return ""
    return (f"{n} op(s) of the FLOP table have no recorded shapes (profile with record_shapes=True): "
            "counted as unknown, not guessed")


def flops_by_op(run, ranks=None):
    ops = op_table(run)
    if ranks is not None:
        ops = ops[ops["rank"].isin(list(ranks))]
    if ops.empty:
        return with_note(pd.DataFrame(columns=list(FLOPS_BY_OP_COLUMNS)),
                         "no operator of the FLOP table in the trace (GEMM, convolution, attention, elementwise)")
    g = ops.groupby(["op_class", "name"], sort=False)
    out = g.agg(count=("event_id", "size"), flops=("flops", lambda x: x.sum() if x.notna().any() else pd.NA),
                bytes=("bytes", lambda x: x.sum() if x.notna().any() else pd.NA),
                kernel_ns=("kernel_ns", lambda x: x.sum() if x.notna().any() else pd.NA),
                unknown_count=("flops", lambda x: int(x.isna().sum()))).reset_index()
    kn = out.kernel_ns.astype("Float64")
    out["achieved_tflops"] = (out.flops.astype("Float64") / kn / 1e3).where(kn > 0)
    out["achieved_gbps"] = (out.bytes.astype("Float64") / kn).where(kn > 0)
    for c in ("flops", "bytes", "kernel_ns"):
        out[c] = out[c].astype("Int64")
    out = out.sort_values(["flops", "count"], ascending=False, na_position="last").reset_index(drop=True)
    return with_note(out[list(FLOPS_BY_OP_COLUMNS)], _note_unknown(ops))


def _device_list(devices) -> list:
    """devices as a list of Devices: a list as it is, else the catalog it names (a file, or None: see catalog)."""
    return devices if isinstance(devices, list) else catalog(devices)


def rank_devices(run, devices=None, device: str | None = None) -> dict:
    """rank -> catalog Device (or None) and the deviceProperties name, from the device its kernels ran on.
    devices: a catalog file (None: the bundled one and $TRACEKIT_DEVICE_CATALOG's) or a list of Devices.
    device: a catalog device the user names (--device) for every rank, the trace's deviceProperties aside."""
    devs = _device_list(devices)
    given = given_device(device, devs) if device is not None else None
    used = run.sql("SELECT rank, mode(device) AS device FROM kernels GROUP BY rank")
    used = dict(zip(used["rank"], used.device))
    out = {}
    for r, p in device_properties(run).items():
        want = used.get(r)
        entry = next((x for x in p if x.get("id") == want), p[0] if p else None)
        name = entry.get("name") if isinstance(entry, dict) else None
        out[int(r)] = (given, name) if given is not None else (match(name, devs), name)
    return out


def _no_device(run, devices: dict, devs: list, nulls: str) -> tuple[dict[int, str], str]:
    """For the ranks without a catalog device (devices: rank_devices'; devs: the catalog it read): rank -> why
    and which columns are null (`nulls`); and what to do, said once (ranks that have a device are left out)."""
    missing = [r for r, (dev, _) in devices.items() if dev is None]
    if not missing:
        return {}, ""
    kernels = run.sql("SELECT rank, count(*) AS n FROM kernels GROUP BY rank")
    kernels = dict(zip(kernels["rank"].astype(int), kernels.n.astype(int)))
    why, gpu = {}, False
    for r in missing:
        name = devices[r][1]
        if name:
            why[r] = f"rank {r}: device {name!r} is not in the device catalog: {nulls}"
        elif kernels.get(r):
            why[r] = (f"rank {r}: {kernels[r]} GPU kernels, but the trace does not name their device (it has no "
                      f"deviceProperties): {nulls}")
        else:
            why[r] = f"rank {r}: no GPU device in the trace (a CPU run): {nulls}"
        gpu = gpu or bool(name or kernels.get(r))
    names = ", ".join(d.name for d in devs)
    fix = (f"name the GPU with --device NAME (device= in Python), one of: {names}; or add it to a catalog "
           "file (--catalog FILE, or TRACEKIT_DEVICE_CATALOG=FILE)") if gpu else ""
    return why, fix


def mfu(run, by_step: bool = False, catalog: str | None = None, device: str | None = None, *,
        ops: pd.DataFrame | None = None):
    """device: the catalog device every rank ran on, for a trace that does not name it (see rank_devices).
    ops: op_table(run) when the caller has built it already (doctor reads mfu and roofline off one table)."""
    ops = op_table(run) if ops is None else ops
    steps = run.sql("SELECT rank, step, ts_ns, end_ns, dur_ns, is_last FROM steps ORDER BY rank, step")
    # the last step of a rank is left out where it has others (it often holds the profiler's teardown)
    steps = steps[median_steps(steps)]
    if steps.empty:
        steps = run.sql("SELECT rank, NULL::BIGINT AS step, first_ts_ns AS ts_ns, last_end_ns AS end_ns, "
                        "last_end_ns - first_ts_ns AS dur_ns FROM ranks")
    devs = _device_list(catalog)  # read once: rank_devices and the notes both name its devices
    devices = rank_devices(run, devs, device)
    why, fix = _no_device(run, devices, devs, "mfu_pct is null")
    rows, notes = [], []
    sized = ops[ops.flops.notna()]
    of_rank = dict(tuple(sized.groupby("rank")))  # (a filter of every op per rank: ranks x ops)
    for r, st in steps.groupby("rank"):
        mine = of_rank.get(r, sized.iloc[:0])
        flop_by_dtype = mine.groupby("dtype").flops.sum() if len(mine) else pd.Series(dtype="float64")
        dtype = str(flop_by_dtype.idxmax()) if len(flop_by_dtype) else None
        dev, _ = devices.get(int(r), (None, None))
        peak = dev.peak(dtype) if dev is not None else None
        if dev is None:
            notes.append(why[int(r)])
        elif peak is None:
            notes.append(f"rank {r}: the catalog has no {dtype} peak for {dev.name}: mfu_pct is null")
        per = []
        t = mine.ts_ns.to_numpy(np.int64)
        f = mine.flops.to_numpy(dtype="float64")
        for s in st.itertuples():
            sel = (t >= s.ts_ns) & (t < s.end_ns)
            per.append({"rank": int(r), "step": s.step, "flops": int(f[sel].sum()), "step_ns": int(s.dur_ns)})
        if by_step:
            rows += per
        else:
            rows.append({"rank": int(r), "step": None, "flops": int(np.median([p["flops"] for p in per])),
                         "step_ns": int(np.median([p["step_ns"] for p in per]))})
        for row in rows[len(rows) - (len(per) if by_step else 1):]:
            row.update({"device": dev.name if dev else None, "dtype": dtype, "peak_tflops": peak})
    out = pd.DataFrame(rows, columns=["rank", "step", "flops", "step_ns", "device", "dtype", "peak_tflops"])
    out["achieved_tflops"] = out.flops / out.step_ns / 1e3
    out["mfu_pct"] = (100.0 * out.achieved_tflops / out.peak_tflops.astype("float64")).where(out.peak_tflops.notna())
    note = "; ".join(dict.fromkeys(notes + [x for x in (fix, _note_unknown(ops)) if x]))
    return with_note(out[list(MFU_COLUMNS)], note)


def roofline(run, catalog: str | None = None, device: str | None = None, *, ops: pd.DataFrame | None = None):
    """device and ops: as mfu's."""
    devs = _device_list(catalog)
    devices = rank_devices(run, devs, device)  # first: a device name not in the catalog is an error on any run
    ops = op_table(run) if ops is None else ops
    ops = ops[ops.flops.notna() & ops.kernel_ns.notna() & (ops.kernel_ns.fillna(0) > 0)]
    if ops.empty:
        return with_note(pd.DataFrame(columns=list(ROOFLINE_COLUMNS)),
                         "no operator with shapes that launched GPU kernels: a roofline needs both")
    why, fix = _no_device(run, devices, devs, "bound, attainable_tflops and share_pct are null")
    rows, notes = [], []
    for (r, c), x in ops.groupby(["rank", "op_class"]):
        dev, _ = devices.get(int(r), (None, None))
        fl, by, kn = float(x.flops.sum()), float(x.bytes.sum()), float(x.kernel_ns.sum())
        dtype = str(x.groupby("dtype").flops.sum().idxmax()) if x.dtype.notna().any() else None
        peak = dev.peak(dtype) if dev else None
        bw = dev.memory_gbps if dev else None
        ai = fl / by if by else None
        ach_t, ach_g = fl / kn / 1e3, by / kn
        bound = attain = share = None
        if peak and bw and ai is not None:
            attain = min(peak, ai * bw / 1e3)
            bound = "compute" if ai * bw / 1e3 >= peak else "memory"
            share = 100.0 * (ach_t / peak if bound == "compute" else ach_g / bw)
        rows.append({"rank": int(r), "op_class": c, "flops": int(fl), "bytes": int(by), "kernel_ns": int(kn),
                     "intensity_flop_per_byte": ai, "achieved_tflops": ach_t, "achieved_gbps": ach_g, "bound": bound,
                     "attainable_tflops": attain, "share_pct": share, "device": dev.name if dev else None,
                     "dtype": dtype})
        if dev is None:
            notes.append(why[int(r)])
    return with_note(pd.DataFrame(rows, columns=list(ROOFLINE_COLUMNS)),
                     "; ".join(dict.fromkeys(notes + ([fix] if notes and fix else []))))
