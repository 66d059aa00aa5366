"""A multi-host testbed on one Linux machine: network namespaces as hosts, shaped veth links.

Each host is a network namespace with one interface `tk0` and address 10.233.0.<i+1>/24. Two hosts
are joined by one veth pair; more hosts hang off a bridge in a switch namespace. Every link end is
shaped with a token-bucket filter (`tc qdisc ... tbf rate R`), so a host sends and receives at
most R. The links carry 9000-byte frames (jumbo frames, as cluster fabrics do) one at a time (no GSO
batches), so that the bucket need hold only two frames and half a millisecond of traffic: TCP then gets
99.1-99.8% of the rate from 50 to 400 Mbit/s. With 1500-byte frames in 64 KiB GSO batches the bucket had
to hold 64 KiB (and 4 ms of traffic), a burst past the rate after every idle spell worth more at high rates
than at low ones, and gloo's all-reduces got 93.4% of 50 Mbit/s but 97.5% of 400: a link whose throughput
grows with its rate, which no link model scales. Programs run inside a host with `ip netns exec`; gloo is told to use `tk0` through
GLOO_SOCKET_IFNAME. The traffic never leaves these namespaces.

Other link kinds, for validating a network model on links it was not shaped for (`frames`, `burst_bytes`):
`frames="gso"` gives 1500-byte frames with GSO/TSO batches of up to 64 KiB (what a stock Linux NIC sends), and
`burst_bytes` sets the token bucket's depth (cloud NICs' burst credits; at least one packet: 2 frames for jumbo
frames, 64 KiB and 2 frames with GSO). run.json's testbed block records both.

Needs root and iproute2. `unavailable_reason()` says why it cannot run here; create and teardown
are idempotent, a failed create tears down what it made, and namespace names carry a per-process
prefix so that parallel runs do not collide.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys

from .errors import TracekitError
# the token bucket: one definition with the replay that models it
from .shaping import (BURST_S, FRAME_BYTES, FRAMES, GSO_BURST_S, MIN_BURST_BYTES, MTU,  # noqa: F401
                      burst_bytes, min_burst_bytes)

IFNAME = "tk0"
SUBNET = "10.233.0"
PREFIX_LEN = 24
QUEUE_LATENCY_MS = 100


# the round trip's probes: UDP datagrams of RTT_BYTES, the median of RTT_PROBES after RTT_WARMUP unrecorded ones
RTT_PROBES, RTT_WARMUP, RTT_BYTES, RTT_PORT = 64, 8, 64, 29519
_ECHO_SERVER = f"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
s.settimeout(20)
for _ in range(int(sys.argv[3]) + {RTT_WARMUP}):
    data, peer = s.recvfrom(2048)
    s.sendto(data, peer)
"""
_ECHO_CLIENT = f"""
import json, socket, statistics, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.0)
got, payload = [], b"x" * {RTT_BYTES}
deadline = time.monotonic() + 15
while len(got) < n + {RTT_WARMUP} and time.monotonic() < deadline:
    t = time.perf_counter_ns()
    try:
        s.sendto(payload, (host, port))
        s.recvfrom(2048)
    except OSError:  # the server not listening yet, or a datagram lost: try again
        time.sleep(0.01)
        continue
    got.append((time.perf_counter_ns() - t) / 1e3)
kept = got[{RTT_WARMUP}:]
print(json.dumps({{"median_us": statistics.median(kept) if kept else None, "probes": len(kept)}}))
"""


class TestbedError(TracekitError):
    """The testbed cannot be created or used here (not root, no iproute2, a command failed)."""

    __test__ = False  # pytest: not a test class despite the name


@dataclasses.dataclass(frozen=True)
class Host:
    index: int
    netns: str
    ip: str
    ifname: str = IFNAME
    rate_mbit: float | None = None

    @property
    def hostname(self) -> str:
        return f"testbed-h{self.index}"

    def exec_argv(self, argv: list[str]) -> list[str]:
        """argv that runs `argv` inside this host, under the host's own hostname: a UTS namespace of its
        own, so that what the program records (a Kineto trace's `host_name`, run.json) tells hosts apart
        the way separate machines would (network namespaces alone share the machine's hostname)."""
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                self.hostname, *argv]

    def env(self) -> dict[str, str]:
        """Environment that makes gloo (and NCCL's socket transport) use the testbed link, and names the
        host in run.json."""
        return {"TRACEKIT_HOST_LABEL": self.hostname, "GLOO_SOCKET_IFNAME": self.ifname,
                "NCCL_SOCKET_IFNAME": self.ifname, "TP_SOCKET_IFNAME": self.ifname}


def unavailable_reason() -> str | None:
    """Why a testbed cannot be built here, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the testbed needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the testbed needs iproute2 ('{tool}' not found; apt-get install iproute2)"
    if shutil.which("unshare") is None:
        return "the testbed needs util-linux's unshare (each host's own hostname; apt-get install util-linux)"
    try:
        probe = f"tk-probe-{os.getpid()}"
        _run(["ip", "netns", "add", probe])
        _run(["ip", "netns", "del", probe])
    except TestbedError as e:
        return f"network namespaces are not usable here: {e}"
    return None


def link_rates(hosts: int, rate_mbit: float | None, host_rates_mbit: dict[int, float] | None = None) -> list[float | None]:
    """Per-host link rate: `rate_mbit` everywhere, overridden per host (a slow link)."""
    rates: list[float | None] = [rate_mbit] * hosts
    for h, r in (host_rates_mbit or {}).items():
        if not 0 <= h < hosts:
            raise TestbedError(f"slow link on host {h}, but the testbed has hosts 0..{hosts - 1}")
        rates[h] = r
    for r in rates:
        if r is not None and r <= 0:
            raise TestbedError(f"link rate must be positive, got {r} Mbit/s")
    return rates


class Testbed:
    """`hosts` namespaces joined by links of `rate_mbit` (None: unshaped). Use as a context manager."""

    __test__ = False  # pytest: not a test class despite the name

    def __init__(self, hosts: int = 2, rate_mbit: float | None = None, *,
                 host_rates_mbit: dict[int, float] | None = None, prefix: str | None = None,
                 frames: str = "jumbo", burst_bytes: int | None = None):
        if hosts < 2:
            raise TestbedError(f"a testbed needs at least 2 hosts, got {hosts}")
        if frames not in FRAMES:
            raise TestbedError(f"link frames {frames!r}: allowed {', '.join(FRAMES)}")
        if burst_bytes is not None and burst_bytes < min_burst_bytes(frames):
            raise TestbedError(f"a token bucket of {burst_bytes} bytes drops every {frames} packet: give at least "
                               f"{min_burst_bytes(frames)} bytes (its largest packet, {FRAMES[frames][1]}, and two frames)")
        self.frames, self.burst_bytes = frames, burst_bytes
        if hosts > 250:
            raise TestbedError(f"at most 250 hosts fit in {SUBNET}.0/{PREFIX_LEN}, got {hosts}")
        self.prefix = prefix or f"tk-{os.getpid()}-"
        rates = link_rates(hosts, rate_mbit, host_rates_mbit)
        self.hosts = [Host(i, f"{self.prefix}h{i}", f"{SUBNET}.{i + 1}", IFNAME, rates[i]) for i in range(hosts)]
        self.switch_netns = f"{self.prefix}sw" if hosts > 2 else None

    # ---- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "Testbed":
        self.create()
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def create(self) -> "Testbed":
        """Build (or rebuild) the namespaces, links, addresses and shaping. Idempotent."""
        reason = unavailable_reason()
        if reason:
            raise TestbedError(reason)
        self.teardown()  # a leftover from a crashed run with the same prefix is replaced
        try:
            for h in self.hosts:
                _run(["ip", "netns", "add", h.netns])
                _run(["ip", "-n", h.netns, "link", "set", "lo", "up"])
            if self.switch_netns is None:
                a, b = self.hosts
                _run(["ip", "link", "add", "name", IFNAME, "netns", a.netns, "type", "veth",
                      "peer", "name", IFNAME, "netns", b.netns])
            else:
                sw = self.switch_netns
                _run(["ip", "netns", "add", sw])
                _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
                _run(["ip", "-n", sw, "link", "set", "br0", "up"])
                for h in self.hosts:
                    port = f"p{h.index}"
                    _run(["ip", "link", "add", "name", port, "netns", sw, "type", "veth",
                          "peer", "name", IFNAME, "netns", h.netns])
                    _run(["ip", "-n", sw, "link", "set", port, "master", "br0"])
                    _run(["ip", "-n", sw, "link", "set", port, "up"])
            for h in self.hosts:
                _frames(h.netns, IFNAME, self.frames)
                if self.switch_netns is not None:
                    _frames(self.switch_netns, f"p{h.index}", self.frames)
                _run(["ip", "-n", h.netns, "addr", "add", f"{h.ip}/{PREFIX_LEN}", "dev", IFNAME])
                _run(["ip", "-n", h.netns, "link", "set", IFNAME, "up"])
            if self.switch_netns is not None:
                _run(["ip", "-n", self.switch_netns, "link", "set", "br0", "mtu", str(FRAMES[self.frames][0])])
            self._shape_all()
        except BaseException:
            self.teardown()
            raise
        return self

    def teardown(self) -> None:
        """Delete every namespace of this testbed (their veths go with them). Idempotent."""
        existing = set(list_namespaces(self.prefix))
        for ns in [h.netns for h in self.hosts] + ([self.switch_netns] if self.switch_netns else []):
            if ns in existing:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)

    # ---- shaping -------------------------------------------------------------------------------
    def shape(self, rate_mbit: float | None, host_rates_mbit: dict[int, float] | None = None) -> None:
        """Change the link rates of a live testbed."""
        rates = link_rates(len(self.hosts), rate_mbit, host_rates_mbit)
        self.hosts = [dataclasses.replace(h, rate_mbit=r) for h, r in zip(self.hosts, rates)]
        self._shape_all()

    def _shape_all(self) -> None:
        if self.switch_netns is None:
            a, b = self.hosts
            # On a direct pair each end's egress is the other's ingress: the slower rate rules both.
            r = _min_rate(a.rate_mbit, b.rate_mbit)
            self._set_rate(a.netns, IFNAME, r)
            self._set_rate(b.netns, IFNAME, r)
            return
        for h in self.hosts:
            # Both directions of a host's link: the host's egress, and the switch port's egress.
            self._set_rate(h.netns, IFNAME, h.rate_mbit)
            self._set_rate(self.switch_netns, f"p{h.index}", h.rate_mbit)

    def _set_rate(self, netns: str, dev: str, rate_mbit: float | None) -> None:
        if rate_mbit is None:
            subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", dev, "root"],
                           capture_output=True, check=False)
            return
        burst = burst_bytes(self.frames, rate_mbit, self.burst_bytes)
        _run(["tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(rate_mbit * 1e6)}bit",
              "burst", str(burst), "latency", f"{QUEUE_LATENCY_MS}ms"])

    # ---- running programs ------------------------------------------------------------------
    def popen(self, host: int, argv: list[str], env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
        h = self.hosts[host]
        full_env = {**os.environ, **h.env(), **(env or {})}
        return subprocess.Popen(h.exec_argv(argv), env=full_env, **kw)

    def run_all(self, commands: list[tuple[int, list[str]]], env: dict[str, str] | None = None,
                timeout_s: float = 600) -> list[tuple[int, str, str]]:
        """Run (host, argv) commands at once; return (exit code, stdout, stderr) for each.

        Output goes to files, not pipes, so that a chatty rank cannot block on a full pipe while
        another is being waited for. When one command fails the others are killed: the ranks of
        a collective job would otherwise wait for the dead one until their own timeout.
        """
        import tempfile
        import time

        with tempfile.TemporaryDirectory(prefix="tk-testbed-") as tmp:
            files, procs = [], []
            try:
                for i, (host, argv) in enumerate(commands):
                    out = open(os.path.join(tmp, f"{i}.out"), "w+")
                    err = open(os.path.join(tmp, f"{i}.err"), "w+")
                    files.append((out, err))
                    procs.append(self.popen(host, argv, env, stdout=out, stderr=err))
                deadline = time.monotonic() + timeout_s
                while any(p.poll() is None for p in procs):
                    if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                    p.wait()
            results = []
            for p, (out, err) in zip(procs, files):
                out.seek(0)
                err.seek(0)
                results.append((p.returncode, out.read(), err.read()))
                out.close()
                err.close()
            return results

    def round_trip_us(self, a: int = 0, b: int = 1, probes: int = RTT_PROBES) -> float:
        """The median round trip (us) of a small UDP datagram from host a to host b and back, through their links:
        what the link adds to a message beyond its bytes' time (a process on each host, as a collective's are).
        This kernel has no ping (no ICMP socket for a script): a UDP echo instead."""
        import json

        port = RTT_PORT
        server = self.popen(b, [sys.executable, "-c", _ECHO_SERVER, self.hosts[b].ip, str(port), str(probes)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            client = subprocess.run(self.hosts[a].exec_argv([sys.executable, "-c", _ECHO_CLIENT, self.hosts[b].ip,
                                                             str(port), str(probes)]),
                                    capture_output=True, text=True, timeout=30)
        finally:
            if server.poll() is None:
                server.kill()
            server.wait()
        try:
            return float(json.loads(client.stdout)["median_us"])
        except (ValueError, KeyError, TypeError):
            raise TestbedError(f"the round trip from host {a} to host {b} could not be measured: "
                               f"{(client.stderr or client.stdout).strip()[-300:]}") from None

    def describe(self) -> dict:
        mtu = FRAMES[self.frames][0]
        how = f"{mtu}-byte frames, no GSO" if self.frames == "jumbo" else f"{mtu}-byte frames, GSO/TSO batches"
        return {"hosts": len(self.hosts), "topology": "veth pair" if self.switch_netns is None else "bridge",
                "shaping": f"tc tbf per link end, {how}", "frames": self.frames, "mtu": mtu,
                "rtt_us": round(self.round_trip_us(), 2),
                "links": [{"host": h.index, "netns": h.netns, "ip": h.ip, "ifname": h.ifname, "rate_mbit": h.rate_mbit,
                           "burst_bytes": burst_bytes(self.frames, h.rate_mbit, self.burst_bytes)
                           if h.rate_mbit is not None else None} for h in self.hosts]}


class PollIdle:
    """Hold the CPUs out of their idle states while a job runs (Linux PM QoS: /dev/cpu_dma_latency at 0 us, the
    request lasting while the file is open). On this VM an idle vCPU halts and the next compute after a wait runs
    slower: the same ops took 1.74x as long per step on a 50 Mbit/s run as on a 400 Mbit/s one (TP; DDP 1.89x),
    1.26x with the CPUs polling. GPU kernels do not slow down while a NIC is busy; a CPU testbed's compute does,
    unless held so. A context manager; `reason` says why it cannot (then it does nothing)."""

    PATH = "/dev/cpu_dma_latency"

    def __init__(self):
        self._f = None
        self.reason = None if os.path.exists(self.PATH) else f"{self.PATH} not present (no PM QoS here)"

    def __enter__(self) -> "PollIdle":
        if self.reason is None:
            try:
                self._f = open(self.PATH, "wb", buffering=0)
                self._f.write((0).to_bytes(4, "little", signed=True))
            except OSError as e:
                self.reason, self._f = f"{self.PATH}: {e.strerror}", None
        return self

    def __exit__(self, *exc) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def list_namespaces(prefix: str = "tk-") -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.startswith(prefix)]


def cleanup_stale(include_live: bool = False) -> list[str]:
    """Delete `tk-<pid>-*` namespaces whose creating process is gone (or all of them)."""
    removed = []
    for ns in list_namespaces("tk-"):
        parts = ns.split("-")
        pid = int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None
        if include_live or pid is None or not _pid_alive(pid):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
            removed.append(ns)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _frames(netns: str, dev: str, frames: str) -> None:
    """jumbo: 9000-byte frames sent one by one (no GSO batch bigger than a frame reaches the token bucket);
    gso: 1500-byte frames in GSO/TSO batches of up to 64 KiB, as a stock NIC sends them."""
    mtu, largest, _ = FRAMES[frames]
    segs = "1" if frames == "jumbo" else "65535"
    _run(["ip", "-n", netns, "link", "set", dev, "mtu", str(mtu), "gso_max_segs", segs, "gso_max_size", str(largest)])


def _min_rate(a: float | None, b: float | None) -> float | None:
    rates = [r for r in (a, b) if r is not None]
    return min(rates) if rates else None


def _run(argv: list[str]) -> None:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise TestbedError(f"'{argv[0]}' not found; the testbed needs iproute2") from None
    if p.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed: {p.stderr.strip() or p.returncode}")
