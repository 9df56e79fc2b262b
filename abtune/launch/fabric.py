"""An emulated interconnect: every simulated node in a Linux network namespace of its own, the nodes
joined by shaped links, so the bytes a method saves become time, and the bytes that cross node
boundaries can be read from the kernel's link counters.

    fabric = Fabric.create(FabricSpec(nodes=2, bandwidth="1gbit"))   # refuses early without root/ip/tc
    try:
        prefix, env = fabric.node_prefix(0), fabric.node_environment(0)  # for the ranks of node 0
        ...
        fabric.counters()                      # bytes (and packets) each node's link sent and received
    finally:
        fabric.remove()

Layout: 2 nodes are joined by one veth pair; more nodes each get a veth pair to a bridge that lives in a
namespace of its own. Every link is created *inside* the run's namespaces (`ip -n NS link add ... peer
... netns OTHER`), so the host's interfaces, addresses and routes are never touched, and interface names
only need to be unique within a namespace of the run (they are short: `fab`, `p0`, `br0`). Namespace
names carry the launcher's pid and a random tag: `abtune-PID-TAG-n0`.

Removal: `remove()` on every normal or failed end and on Ctrl-C; a watchdog process (started with the
fabric, in a session of its own) removes it if the launcher dies without doing so (SIGKILL): it waits on a
pipe only the launcher holds. Removing a namespace also kills what still runs in it (a rank left behind)
and so frees its links and qdiscs. As a last resort, `Fabric.create` reaps fabrics whose launcher is gone.

Shaping (iproute2 `tc`): each node's egress gets netem (`latency_ms`) and tbf (`bandwidth`); behind a
bridge, the bridge's port towards each node gets the same tbf, so every node has a full-duplex link of
`bandwidth` each way and a one-way latency of `latency_ms` to every other node. Loss (`loss_pct`) is
an iptables rule in each node's namespace that drops that share of the packets reaching the node on
its link, at random (`-m statistic`): one loss point between any two nodes, as netem's on the way out
would be, and it needs no netem (which some kernels, this project's sandbox among them, lack).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from abtune.errors import ConfigError
from abtune.launch import netns
from abtune.launch.netns import ETC_NETNS, NETNS_DIR
from abtune.launch.pids import process_alive
from abtune.launch.profiles import FabricFault, FabricProfile, parse_rate_bits
from abtune.runfiles import METRICS_FILE

PREFIX = "abtune-"
NODE_LINK = "fab"  # the node's end of its link, in the node's namespace
BRIDGE = "br0"
SUBNET = "10.213.0"  # exists only inside the run's namespaces
PREFIX_LEN = 24
TBF_LATENCY_MS = 50  # longest a packet may wait in the shaper's queue before tbf drops it
TBF_MIN_BURST_BYTES = 8 * 1024  # a few full-size frames (tbf cuts larger GSO packets into frames)
TBF_BURST_SECONDS = 0.001  # burst = 1 ms at the configured rate, when that is more
REMOVE_ATTEMPTS = 20
REMOVE_PAUSE_S = 0.05
HEADER_BYTES = 14 + 20 + 32  # per packet: Ethernet, IPv4, TCP with the timestamps option (Linux's default)


@dataclass(frozen=True)
class FabricSpec:
    """The emulated link: `bandwidth` in tc's units (`1gbit`, `100mbit`; None: unshaped)."""

    nodes: int
    bandwidth: str | None = None
    latency_ms: float = 0.0
    loss_pct: float = 0.0
    netem_always: bool = False  # a netem qdisc even at 0 ms, so faults can change the latency later


@dataclass(frozen=True)
class LinkCounters:
    tx_bytes: int
    rx_bytes: int
    tx_packets: int
    rx_packets: int


def missing_requirements(loss: bool = False) -> list[str]:
    """What keeps this process from building a fabric (`loss`: one that loses packets), in words (empty: nothing)."""
    missing = [f"the `{tool}` command (apt-get install -y iproute2)" for tool in ("ip", "tc") if not shutil.which(tool)]
    if loss and not shutil.which("iptables"):
        missing.append("the `iptables` command for loss_pct (apt-get install -y iptables)")
    if not _has_net_admin():
        missing.insert(0, "root or CAP_NET_ADMIN (run as root, or grant the capability)")
    return missing


def check_requirements(loss: bool = False) -> None:
    missing = missing_requirements(loss)
    if missing:
        raise ConfigError(f"the emulated interconnect needs {' and '.join(missing)}; "
                          "or use --launcher local (loopback, no link to measure)")


def _has_net_admin() -> bool:
    cap_net_admin = 12
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> cap_net_admin & 1)
    return os.geteuid() == 0


def check_fabric(settings: FabricProfile, nodes: int, steps: int | None = None) -> None:
    """Refuse in one line, before anything starts, what this fabric cannot do for a run of `nodes` simulated
    nodes and `steps` steps: a fault on a node the run lacks or after its last step (it would never happen),
    a latency this kernel cannot emulate (no netem)."""
    for fault in settings.faults:
        if fault.node >= nodes:
            raise ConfigError(f"fabric.faults: node {fault.node} does not exist; this run has nodes 0-{nodes - 1}")
        if steps is not None and fault.at_step > steps:
            raise ConfigError(f"fabric.faults: the fault at step {fault.at_step} comes after the run's last step "
                              f"(train.steps {steps}): it would never happen; lower at_step or raise train.steps")
    asks = ("latency_ms" if settings.latency_ms else
            "a fault's latency_ms" if any(f.latency_ms is not None for f in settings.faults) else None)
    if asks is not None and nodes > 1 and (missing := _netem_missing()) is not None:
        raise ConfigError(f"fabric: {asks} needs netem, and this kernel has no netem ({missing}): latency cannot be "
                          "emulated here; loss_pct and bandwidth can")


def _netem_missing() -> str | None:
    """tc's refusal of a netem qdisc in a network namespace that lives for this one command; None when netem
    works (or nothing here can tell: no unshare)."""
    if shutil.which("unshare") is None:
        return None
    probe = subprocess.run(["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "0ms"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else (probe.stderr.strip().splitlines() or ["tc failed"])[-1]


def _kernel_hint(error: str) -> str:
    if "netem" in error and "unknown" in error:
        return " (this kernel has no netem: latency_ms and its faults cannot be emulated here; loss_pct can)"
    return ""


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip() or result.returncode}")
    return result.stdout


@dataclass
class Fabric:
    """One run's namespaces and links; see the module's docstring."""

    spec: FabricSpec
    tag: str
    namespaces: list[str] = field(default_factory=list)
    _watchdog: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _anchors: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    _watch_fd: int | None = field(default=None, repr=False)

    @classmethod
    def create(cls, spec: FabricSpec, loss_faults: bool = False) -> Fabric:
        """`loss_faults`: faults will change the loss later (iptables is needed then, too)."""
        check_requirements(loss=spec.loss_pct > 0 or loss_faults)
        reap_orphans()
        fabric = cls(spec, f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}")
        names = [fabric.node_namespace(i) for i in range(spec.nodes)]
        if spec.nodes > 2:
            names.append(fabric.bridge_namespace)
        fabric._start_watchdog(names)
        try:
            for name in names:
                fabric._add_namespace(name)
            fabric._wire()
            fabric._start_anchors()
        except RuntimeError as error:  # ip or tc refused: the kernel lacks what the profile asks for
            fabric.remove()
            raise ConfigError(f"the emulated fabric could not be built: {error}{_kernel_hint(str(error))}") from None
        except BaseException:
            fabric.remove()
            raise
        return fabric

    # --- names and what a rank needs ---------------------------------------------------
    def node_namespace(self, node: int) -> str:
        return f"{self.tag}-n{node}"

    @property
    def bridge_namespace(self) -> str:
        return f"{self.tag}-br"

    @staticmethod
    def address(node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    def node_prefix(self, node: int) -> list[str]:
        """The command prefix that starts a process inside `node`'s namespace."""
        return netns.exec_prefix(self.node_namespace(node))

    def node_environment(self, node: int) -> dict[str, str]:
        """What a rank of `node` needs: the rendezvous on node 0's address, gloo on the node's link."""
        return {"MASTER_ADDR": self.address(0), "GLOO_SOCKET_IFNAME": NODE_LINK}

    # --- building ----------------------------------------------------------------------
    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self.namespaces.append(name)
        # Names for the node addresses and no DNS server (none is reachable from here): torch looks up
        # the names of its peers and would wait for a DNS timeout at every connection. Its store accepts on
        # a dual-stack socket, where a peer is ::ffff:ADDR: glibc finds that name only under that spelling
        # (without it every rank printed "[c10d] The hostname of the client socket cannot be retrieved").
        (ETC_NETNS / name).mkdir(parents=True, exist_ok=True)
        hosts = "".join(f"{prefix}{self.address(n)} {self.tag}-n{n}\n"
                        for n in range(self.spec.nodes) for prefix in ("", "::ffff:"))
        (ETC_NETNS / name / "hosts").write_text(f"127.0.0.1 localhost {socket.gethostname()}\n{hosts}")
        (ETC_NETNS / name / "resolv.conf").write_text("# no DNS inside an abtune fabric\n")
        # No IPv6 on the run's links: router solicitations and neighbour discovery would add bytes to the counters.
        _run(["ip", "netns", "exec", name, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
              "net.ipv6.conf.default.disable_ipv6=1"])
        _ip("-n", name, "link", "set", "lo", "up")

    def _wire(self) -> None:
        nodes = range(self.spec.nodes)
        if self.spec.nodes == 2:
            _ip("-n", self.node_namespace(0), "link", "add", NODE_LINK, "type", "veth",
                "peer", "name", NODE_LINK, "netns", self.node_namespace(1))
        elif self.spec.nodes > 2:
            bridge = self.bridge_namespace
            _ip("-n", bridge, "link", "add", BRIDGE, "type", "bridge")
            _ip("-n", bridge, "link", "set", BRIDGE, "up")
            for node in nodes:
                port = f"p{node}"
                _ip("-n", self.node_namespace(node), "link", "add", NODE_LINK, "type", "veth",
                    "peer", "name", port, "netns", bridge)
                _ip("-n", bridge, "link", "set", port, "master", BRIDGE, "up")
                self._shape(bridge, port, delay=False)
        if self.spec.nodes < 2:
            return
        for node in nodes:
            namespace = self.node_namespace(node)
            _ip("-n", namespace, "addr", "add", f"{self.address(node)}/{PREFIX_LEN}", "dev", NODE_LINK)
            _ip("-n", namespace, "link", "set", NODE_LINK, "up")
            self._shape(namespace, NODE_LINK, delay=True)
            if self.spec.loss_pct:
                self.set_loss(node, self.spec.loss_pct)

    def _shape(self, namespace: str, device: str, delay: bool) -> None:
        """netem (latency) at the root when asked for, tbf (rate) below it or at the root."""
        spec, tc = self.spec, ["tc", "-n", namespace, "qdisc", "add", "dev", device]
        parent = ["root"]
        if delay and (spec.latency_ms or spec.netem_always):
            _run([*tc, "root", "handle", "1:", "netem", "delay", f"{spec.latency_ms}ms"])
            parent = ["parent", "1:"]
        if spec.bandwidth is not None:
            rate_bytes = parse_rate_bits(spec.bandwidth) / 8
            burst = max(TBF_MIN_BURST_BYTES, int(rate_bytes * TBF_BURST_SECONDS))
            _run([*tc, *parent, "handle", "2:", "tbf", "rate", spec.bandwidth, "burst", str(burst),
                  "latency", f"{TBF_LATENCY_MS}ms"])

    # --- faults --------------------------------------------------------------------------
    def set_link(self, node: int, up: bool) -> None:
        _ip("-n", self.node_namespace(node), "link", "set", NODE_LINK, "up" if up else "down")

    def set_latency(self, node: int, latency_ms: float) -> None:
        """The node's way out from now on (the fabric must have been made with `netem_always`)."""
        _run(["tc", "-n", self.node_namespace(node), "qdisc", "change", "dev", NODE_LINK, "root", "handle", "1:",
              "netem", "delay", f"{latency_ms}ms"])

    def set_loss(self, node: int, loss_pct: float) -> None:
        """From now on, drop `loss_pct` % of the packets that reach `node` on its link, at random."""
        iptables = ["ip", "netns", "exec", self.node_namespace(node), "iptables", "-w"]
        _run([*iptables, "-F", "INPUT"])  # the namespace's own table: only this rule is ever in it
        if loss_pct > 0:
            _run([*iptables, "-A", "INPUT", "-i", NODE_LINK, "-m", "statistic", "--mode", "random",
                  "--probability", f"{loss_pct / 100:.6f}", "-j", "DROP"])

    # --- reading -----------------------------------------------------------------------
    def counters(self) -> list[LinkCounters]:
        """Each node's link, as the node sees it: tx = bytes that left the node, rx = bytes that reached it."""
        if self.spec.nodes < 2:
            return [LinkCounters(0, 0, 0, 0)]
        return [self.link_counters(node) for node in range(self.spec.nodes)]

    def link_counters(self, node: int) -> LinkCounters:
        """Read through the node's anchor process (/proc/PID/net/dev shows PID's namespace): a file read, no
        subprocess, so that samples taken while the ranks run are timed to a few microseconds."""
        for line in Path(f"/proc/{self._anchors[node].pid}/net/dev").read_text().splitlines():
            name, _, numbers = line.partition(":")
            if name.strip() == NODE_LINK:
                fields = [int(n) for n in numbers.split()]
                return LinkCounters(tx_bytes=fields[8], rx_bytes=fields[0], tx_packets=fields[9], rx_packets=fields[1])
        raise RuntimeError(f"no link {NODE_LINK} in namespace {self.node_namespace(node)}")

    def retransmitted_segments(self) -> list[int]:
        """TCP segments each node's kernel sent again (RetransSegs in the node's /proc/net/snmp): what loss costs."""
        if self.spec.nodes < 2:
            return [0]
        counts = []
        for anchor in self._anchors:
            header, values = (line.split()[1:] for line in Path(f"/proc/{anchor.pid}/net/snmp").read_text()
                              .splitlines() if line.startswith("Tcp:"))
            counts.append(int(values[header.index("RetransSegs")]))
        return counts

    def _start_anchors(self) -> None:
        """One idle process per node namespace, to read the node's counters through."""
        for node in range(self.spec.nodes if self.spec.nodes > 1 else 0):
            anchor = subprocess.Popen([*self.node_prefix(node), "sleep", "infinity"], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            self._anchors.append(anchor)
            inside = f"net:[{(NETNS_DIR / self.node_namespace(node)).stat().st_ino}]"
            while os.readlink(f"/proc/{anchor.pid}/ns/net") != inside:  # until `ip netns exec` has entered it
                if anchor.poll() is not None:
                    raise RuntimeError(f"could not start a process in {self.node_namespace(node)}")
                time.sleep(REMOVE_PAUSE_S)

    # --- removal -----------------------------------------------------------------------
    def _start_watchdog(self, names: list[str]) -> None:
        read_end, self._watch_fd = os.pipe()
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "abtune.launch.fabric", "watch", *names], stdin=read_end,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        os.close(read_end)

    def remove(self) -> None:
        """Remove everything the fabric made; safe to call twice."""
        remove_namespaces(self.namespaces)  # kills the anchors too
        self.namespaces = []
        for anchor in self._anchors:
            anchor.wait()
        self._anchors = []
        if self._watch_fd is not None:
            os.write(self._watch_fd, b"removed\n")
            os.close(self._watch_fd)
            self._watch_fd = None
        if self._watchdog is not None:
            self._watchdog.wait()
            self._watchdog = None


class NodeNetwork:
    """How the ranks of each simulated node reach the others: here the loopback, nothing to set up."""

    def namespace(self, node: int) -> str | None:
        """The network namespace the node's ranks run in; None: this one."""
        return None

    def environment(self, node: int) -> dict[str, str]:
        return {"MASTER_ADDR": "127.0.0.1"}

    def sample(self) -> None:
        """Called while the ranks run (every launcher poll)."""


class EmulatedNetwork(NodeNetwork):
    """The ranks of each node in the node's namespace of `fabric`; reads the links before and after."""

    def __init__(self, fabric: Fabric, faults: tuple[FabricFault, ...] = (), run_dir: Path | None = None) -> None:
        self.fabric = fabric
        self.start = fabric.counters()
        self.start_retransmits = fabric.retransmitted_segments()
        self._last: list[tuple[float, int]] | None = None
        self.peak_bits_per_s = 0.0
        self.pending = sorted(faults, key=lambda f: f.at_step)
        self.applied: list[dict[str, object]] = []
        self._steps = StepWatcher(run_dir / METRICS_FILE) if run_dir is not None and faults else None

    def sample(self) -> None:
        self._apply_due_faults()
        self._sample_rate()

    def _apply_due_faults(self) -> None:
        if not self.pending or self._steps is None:
            return
        step = self._steps.latest()
        while self.pending and step >= self.pending[0].at_step:
            fault = self.pending.pop(0)
            if fault.link is not None:
                self.fabric.set_link(fault.node, fault.link == "up")
            if fault.latency_ms is not None:
                self.fabric.set_latency(fault.node, fault.latency_ms)
            if fault.loss_pct is not None:
                self.fabric.set_loss(fault.node, fault.loss_pct)
            self.applied.append({**fault.model_dump(exclude_none=True), "seen_at_step": step, "time": time.time()})

    def _sample_rate(self) -> None:
        """The fastest any node's link sent over one launcher poll: what `bandwidth` must bound."""
        now = [self._timed_tx(node) for node in range(self.fabric.spec.nodes)] if self.fabric.spec.nodes > 1 else []
        if self._last is not None:
            rates = [8 * (tx - tx0) / (t - t0) for (t, tx), (t0, tx0) in zip(now, self._last, strict=True) if t > t0]
            self.peak_bits_per_s = max([self.peak_bits_per_s, *rates])
        self._last = now

    def _timed_tx(self, node: int) -> tuple[float, int]:
        before = time.monotonic()
        tx = self.fabric.link_counters(node).tx_bytes
        return (before + time.monotonic()) / 2, tx

    def namespace(self, node: int) -> str | None:
        return self.fabric.node_namespace(node)

    def environment(self, node: int) -> dict[str, str]:
        return self.fabric.node_environment(node)

    def record(self, run_dir: Path) -> None:
        """Add what each node's link carried during this launch to RUN_DIR/summary.json (a finished run's)."""
        from abtune.runfiles import find_summary, write_summary
        from abtune.training.summary import add_measured_traffic

        found = find_summary(run_dir)
        if found is None:
            return
        end = self.fabric.counters()
        retransmits = [e - s for s, e in zip(self.start_retransmits, self.fabric.retransmitted_segments(), strict=True)]
        summary = found.raw
        add_measured_traffic(summary, [e.tx_bytes - s.tx_bytes for s, e in zip(self.start, end, strict=True)],
                             [e.rx_bytes - s.rx_bytes for s, e in zip(self.start, end, strict=True)],
                             [e.tx_packets - s.tx_packets for s, e in zip(self.start, end, strict=True)], HEADER_BYTES)
        summary["traffic"]["measured_inter_node_bytes"]["link"] = {
            "bandwidth": self.fabric.spec.bandwidth, "latency_ms": self.fabric.spec.latency_ms,
            "loss_pct": self.fabric.spec.loss_pct, "namespaces": self.fabric.namespaces,
            "peak_bits_per_s": self.peak_bits_per_s, "faults": self.applied,
            "tcp_retransmitted_segments": retransmits,
            "peak_note": "the fastest a node's link sent over one launcher poll (headers included)"}
        write_summary(run_dir, summary)


@contextlib.contextmanager
def node_network(settings: FabricProfile | None, nodes: int, run_dir: Path, resume: bool = False) -> Iterator[NodeNetwork]:
    """The loopback without `settings`; else a fabric of its own for this run, removed however the run ends.

    Faults are events of a run that starts from step 0: a run resumed from a checkpoint (a study's
    retry, `--resume`) replays none, so a drill's trial fails once and its retry finds the link back."""
    if settings is None:
        yield NodeNetwork()
        return
    check_fabric(settings, nodes)
    fabric = Fabric.create(FabricSpec(nodes, settings.bandwidth, settings.latency_ms, settings.loss_pct,
                                      netem_always=any(f.latency_ms is not None for f in settings.faults)),
                           loss_faults=settings.loses_packets)
    try:
        network = EmulatedNetwork(fabric, () if resume else settings.faults, run_dir)
        yield network
        network.record(run_dir)
    finally:
        fabric.remove()


class StepWatcher:
    """The latest step in a run's metrics.jsonl (rank 0's log records), read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._step = 0

    def latest(self) -> int:
        if not self.path.is_file():
            return self._step
        with self.path.open("rb") as stream:
            stream.seek(self._offset)
            chunk = stream.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written is read next time
        self._offset += len(complete)
        for line in complete.splitlines():
            with contextlib.suppress(ValueError):
                self._step = max(self._step, int(json.loads(line).get("step", 0)))
        return self._step


def remove_namespaces(names: list[str]) -> None:
    """Kill what still runs in each namespace (ranks left behind), then delete it; its links and
    qdiscs go with it."""
    for name in names:
        for _ in range(REMOVE_ATTEMPTS if (NETNS_DIR / name).exists() else 0):
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(REMOVE_PAUSE_S)
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        shutil.rmtree(ETC_NETNS / name, ignore_errors=True)


def fabric_namespaces() -> list[str]:
    """The names of every abtune namespace on this machine, of any run."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(PREFIX))


def reap_orphans() -> None:
    """Remove the fabrics of launchers that no longer exist (their watchdog was killed too)."""
    orphans = [name for name in fabric_namespaces()
               if not process_alive({"pid": name[len(PREFIX):].split("-")[0]})]
    remove_namespaces(orphans)


def watch(names: list[str]) -> None:
    """The watchdog: block until the launcher closes the pipe (stdin); remove the namespaces unless it
    said it removed them itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the launcher
    said = sys.stdin.buffer.read()
    if b"removed" not in said:
        remove_namespaces(names)


if __name__ == "__main__":
    if sys.argv[1:2] == ["watch"]:
        watch(sys.argv[2:])
