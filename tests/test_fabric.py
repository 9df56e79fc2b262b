"""The emulated interconnect (`--launcher emulated`): simulated nodes in network namespaces, joined by
shaped links. The modelled inter-node bytes must match what the kernel counted on the links, a shaped
link must hold its rate, and nothing the run made may outlive it, however it ends.

These need root (or CAP_NET_ADMIN), iproute2 and, for a link that loses packets, iptables. As root the
packages are installed when missing (tests/system.py, as for SLURM and PostgreSQL); without, the tests skip
locally and fail under CI=true.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from optuna.trial import TrialState

from abtune.launch.fabric import fabric_namespaces, missing_requirements
from abtune.launch.profiles import parse_rate_bits
from abtune.runfiles import read_summary
from tests import system
from tests.conftest import CliResult, abtune_command, write_config
from tests.study_cli import in_process
from tests.study_helpers import TINY_BASE, trials_of, write_study

# TCP/IP headers are dropped from the counters (66 bytes a packet, `HEADER_BYTES`) and gloo's framing is in
# the model (abtune/wire.py); what stays is the store's rendezvous: 0.04-0.7% on 2026-11-25 (sbc the most).
AGREEMENT = 0.03
MODEL = {"hidden_dim": 64, "mlp_dim": 128, "num_layers": 2}
# Every method at its defaults: SBC (delay 10, 1% of entries, binarized) exchanges once in 12 steps, a few KB
# in many small messages, and PowerSGD sends three all-reduces a bucket; their framing is what was missing.
METHODS: dict[str, dict[str, Any]] = {"ddp": {}, "ab": {}, "sbc": {}, "powersgd": {}}
# Slow enough that a ddp step's all-reduce keeps the link busy for longer than a launcher poll (so the
# fastest poll shows the rate), and that an unshaped link would exceed it (a step's bytes in one poll).
SHAPED = "5mbit"
RATE_TOLERANCE = 0.15  # tbf's burst (8 KiB: 7% of a 0.2 s poll at 5 Mbit/s) and the poll's timing
GONE_DEADLINE_S = 120
TRAINING_DEADLINE_S = 300  # until a long run's first step: a safety net, so that a hung start fails, not hangs
# 15 steps: warmup 3, then AB phases of 3 steps inside each node, one inter-node sync after each (the
# paper's 1/30 would sync after every step of so short a run, sending more than ddp)
SHAPED_STEPS = 15
AB_LONG_PHASES = {"warmup_frac": 0.2, "ab_frac": 0.2, "rebound_frac": 0.0}
FABRIC_PACKAGES = ("iproute2", "iptables")  # ip and tc; iptables for a link that loses packets


def require_fabric(loss: bool = False) -> None:
    """What the fabric needs (`loss`: iptables too), installed if missing; else skip, or fail under CI=true."""
    tools = ("ip", "tc", "iptables") if loss else ("ip", "tc")
    not_installed = system.apt_get_install(FABRIC_PACKAGES) if not all(map(shutil.which, tools)) else None
    missing = missing_requirements(loss)
    if missing:
        system.unavailable("the emulated interconnect", f"it needs {' and '.join(missing)}"
                           + (f" ({not_installed})" if not_installed else ""))


def profile(path: Path, **fabric: Any) -> Path:
    path.write_text(yaml.safe_dump({"kind": "local", "fabric": fabric}))
    return path


Abtune = Callable[..., CliResult]


@pytest.fixture
def abtune_fd(abtune_main_fd: Abtune) -> Abtune:
    """`abtune ARGS` in this process (a new Python per run costs about 4 s of CPU here), its output read from the
    file descriptors so that what the ranks print counts too; `check` fails the test on an exit other than 0."""
    return functools.partial(in_process, abtune_main_fd)


def host_network() -> tuple[str, str, str]:
    """What the host has (links, addresses, qdiscs, routes), for before/after comparisons."""
    def show(*args: str) -> str:
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout

    return show("ip", "-o", "link"), show("ip", "-o", "addr") + show("ip", "route"), show("tc", "qdisc", "show")


def train(abtune_fd: Abtune, tmp_path: Path, launcher: Path, nproc: int, per_node: int, method: str,
          method_options: dict[str, Any] | None = None, **train_section: Any) -> dict[str, Any]:
    config = write_config(tmp_path / f"{method}.yaml", model=MODEL, method={"name": method, **(method_options or {})},
                          train={"steps": 12, "eval_every": 1000, **train_section})
    run_dir = tmp_path / f"run-{method}-{per_node}"
    result = abtune_fd("train", str(config), "--launcher", str(launcher), "--nproc", str(nproc), "--ranks-per-node",
                       str(per_node), "--run-dir", str(run_dir), "--no-tracking")
    # every peer has a name inside the fabric: torch's store no longer warns of each connection it accepts
    assert "hostname of the client socket cannot be retrieved" not in result.stdout + result.stderr, result.stderr
    return read_summary(run_dir).raw


# Each method once, and AB (whose groups keep inside a node when there are 2 ranks a node) both ways;
# both layouts appear: 2 ranks a node (intra-node traffic left out) and 1 (all of it inter-node).
# DDP and AB at 2 ranks a node are checked on the shaped link's runs below.
LAYOUTS = [("ab", 1), ("sbc", 1), ("powersgd", 2)]


def assert_model_matches_link(summary: dict[str, Any]) -> None:
    measured = summary["traffic"]["measured_inter_node_bytes"]
    modelled = sum(summary["traffic"]["inter_node_bytes_by_node"]) + sum(summary["traffic"]["inter_node_framing_bytes_by_node"])
    assert modelled > 0 and modelled == measured["modelled"]
    assert measured["payload"] == pytest.approx(modelled, rel=AGREEMENT), measured
    # what left the nodes reached nodes (behind a bridge not to the byte: it floods ARP broadcasts to every port)
    assert sum(measured["by_node_rx"]) == pytest.approx(sum(measured["by_node_tx"]), rel=1e-3)
    assert summary["traffic"]["inter_node_bytes"]["mean"] * 4 == pytest.approx(sum(summary["traffic"]["inter_node_bytes_by_node"]))


@pytest.mark.slow
@pytest.mark.parametrize(("method", "per_node"), LAYOUTS, ids=[f"{m}-{4 // n}x{n}" for m, n in LAYOUTS])
def test_modelled_inter_node_bytes_match_the_link_counters(tmp_path: Path, abtune_fd: Abtune, method: str,
                                                           per_node: int) -> None:
    require_fabric()
    before = host_network()
    summary = train(abtune_fd, tmp_path, profile(tmp_path / "emulated.yaml"), 4, per_node, method, METHODS[method])
    assert_model_matches_link(summary)
    measured = summary["traffic"]["measured_inter_node_bytes"]
    assert measured["link"]["namespaces"] and not set(measured["link"]["namespaces"]) & set(fabric_namespaces())
    assert host_network() == before


@pytest.mark.slow
def test_a_shaped_link_holds_its_rate_and_carries_fewer_bytes_for_ab(tmp_path: Path, abtune_fd: Abtune) -> None:
    require_fabric()
    shaped = profile(tmp_path / "shaped.yaml", bandwidth=SHAPED)
    ddp = train(abtune_fd, tmp_path, shaped, 4, 2, "ddp", steps=SHAPED_STEPS)
    ab = train(abtune_fd, tmp_path, shaped, 4, 2, "ab", AB_LONG_PHASES, steps=SHAPED_STEPS)
    rate = parse_rate_bits(SHAPED)
    for summary in (ddp, ab):
        assert_model_matches_link(summary)
        link = summary["traffic"]["measured_inter_node_bytes"]["link"]
        assert link["bandwidth"] == SHAPED
        assert link["peak_bits_per_s"] <= rate * (1 + RATE_TOLERANCE), link
    assert ddp["traffic"]["measured_inter_node_bytes"]["link"]["peak_bits_per_s"] >= rate * (1 - RATE_TOLERANCE)
    assert ddp["traffic"]["measured_inter_node_bytes"]["total"] > ab["traffic"]["measured_inter_node_bytes"]["total"]


def start_long_run(tmp_path: Path) -> subprocess.Popen[str]:
    # a line every step: training is seen at its first step, not its tenth (steps of 4 ranks: seconds under load)
    config = write_config(tmp_path / "long.yaml", train={"steps": 100000, "eval_every": 100000, "log_every": 1})
    return subprocess.Popen([*abtune_command(), "train", str(config), "--launcher", str(profile(tmp_path / "e.yaml")),
                             "--nproc", "4", "--ranks-per-node", "2", "--run-dir", str(tmp_path / "long"),
                             "--no-tracking"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def namespaces_of(launcher: subprocess.Popen[str]) -> list[str]:
    return [name for name in fabric_namespaces() if name.startswith(f"abtune-{launcher.pid}-")]


def wait_until_training(launcher: subprocess.Popen[str], run_dir: Path) -> list[str]:
    """The run's namespaces, once its ranks train (their metrics file has a line)."""
    deadline = time.monotonic() + TRAINING_DEADLINE_S
    while not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text():
        assert launcher.poll() is None, launcher.communicate()
        assert time.monotonic() < deadline, f"no step within {TRAINING_DEADLINE_S} s: {namespaces_of(launcher)}"
        time.sleep(0.1)
    names = namespaces_of(launcher)
    assert len(names) == 2
    return names


def rank_pids(namespace: str) -> list[int]:
    """The ranks in a node's namespace (beside them: the fabric's process that holds it open). A cold rank
    runs abtune.training.worker; a warm one is a fork of the warm server, and shows the server's command."""
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
    commands = (b"abtune.training.worker", b"abtune.launch.warm")
    return [int(pid) for pid in out.split() if any(c in Path(f"/proc/{pid}/cmdline").read_bytes() for c in commands)]


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed rank whose launcher died waits for an init that may never reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_until_gone(names: list[str], pids: list[int]) -> None:
    """Removal by the watchdog is asynchronous; polled, with a deadline only a hang reaches."""
    deadline = time.monotonic() + GONE_DEADLINE_S
    while set(names) & set(fabric_namespaces()) or any(running(pid) for pid in pids):
        assert time.monotonic() < deadline, (fabric_namespaces(), pids)
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigkill-launcher", "rank-crash"])
def test_an_interrupted_run_leaves_no_namespace_link_or_qdisc(tmp_path: Path, how: str) -> None:
    require_fabric()
    before = host_network()
    launcher = start_long_run(tmp_path)
    try:
        names = wait_until_training(launcher, tmp_path / "long")
        pids = [pid for name in names for pid in rank_pids(name)]
        assert len(pids) == 4
        if how == "ctrl-c":
            os.killpg(launcher.pid, signal.SIGINT)  # what a terminal sends: to the launcher and its ranks
            assert launcher.wait() == 130
            assert not set(names) & set(fabric_namespaces())  # removed before the launcher returned
        elif how == "sigkill-launcher":
            launcher.kill()
            launcher.wait()
        else:
            os.kill(pids[-1], signal.SIGKILL)
            assert launcher.wait() == 1
            assert "was killed by SIGKILL" in launcher.communicate()[1]
        wait_until_gone(names, pids)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert host_network() == before


def test_the_emulated_launcher_refuses_in_one_line_without_ip_and_tc(tmp_path: Path,
                                                                      abtune_main: Callable[..., CliResult]) -> None:
    config = write_config(tmp_path / "run.yaml")
    without_iproute2 = {"PATH": str(Path(sys.executable).parent)}  # the venv's bin: python, abtune
    result = abtune_main("train", str(config), "--launcher", str(profile(tmp_path / "e.yaml")), "--nproc", "2",
                         "--run-dir", str(tmp_path / "run"), env=without_iproute2)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "`ip`" in result.stderr and "`tc`" in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


def test_a_bandwidth_tc_cannot_read_is_refused_in_one_line(tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    config = write_config(tmp_path / "run.yaml")
    result = abtune_main("train", str(config), "--launcher", str(profile(tmp_path / "e.yaml", bandwidth="fast")),
                         "--nproc", "2")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "fast" in result.stderr, result.stderr


# --- faults on the emulated link -------------------------------------------------------------------------
HANG_FLOOR_S = 5  # train.hang.floor_s: how long a rank waits for a peer behind a dead link (gloo's timeout: 600 s)
FAULT_BOUND_S = 90  # the fault's step, the floor, the launcher's clean-up, with room for a loaded machine


@pytest.mark.slow
def test_a_link_taken_down_mid_run_fails_it_in_one_line_naming_the_node_and_leaves_nothing(
        tmp_path: Path, abtune_fd: Abtune) -> None:
    """The profile's fault takes node 1's link down at step 10 of 2000: the ranks wait for each other, and the hang
    detector of a rank on node 0 fails the run in one line at its 5 s floor (not the process group's 600 s timeout)
    naming node 1 and its ranks, which it no longer hears from in the rendezvous store, then itself, its step and
    what it waited for; no process or namespace is left."""
    require_fabric()
    before, namespaces = host_network(), set(fabric_namespaces())
    config = write_config(tmp_path / "run.yaml", model=MODEL, train={
        "steps": 2000, "log_every": 5, "eval_every": 1000, "hang": {"floor_s": HANG_FLOOR_S, "untimed_s": 120}})
    launcher = profile(tmp_path / "down.yaml", faults=[{"at_step": 10, "node": 1, "link": "down"}])
    started = time.monotonic()
    result = abtune_fd("train", str(config), "--launcher", str(launcher), "--nproc", "4", "--ranks-per-node", "2",
                       "--run-dir", str(tmp_path / "run"), "--no-tracking", check=False)
    took = time.monotonic() - started
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    # (last: in step 9, say, or in set-up when its ten steps took less than a second of publishing)
    assert re.match(r"abtune: error: node 1 \(ranks 2, 3\) stopped responding: not heard from for \d+ s, last [^;]+; "
                    r"rank [01] \(node 0\) made no progress for \d+ s in step \d+ \(phase train\), "
                    r"not in a collective \(the last it issued: all_reduce over group 'world' of 4 ranks",
                    result.stderr), result.stderr
    assert re.search(r"the bound was \d+ s \((train.hang.floor_s|10 x its longest step)", result.stderr), result.stderr
    assert took < FAULT_BOUND_S, took
    steps = [json.loads(line).get("step", 0) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 10 <= max(steps) < 2000  # it trained up to the fault, and no further
    assert set(fabric_namespaces()) == namespaces and host_network() == before


@pytest.mark.parametrize(("fault", "expected"), [
    ({"at_step": 5}, "a fault changes something: give link (down|up), loss_pct or latency_ms"),
    ({"at_step": 0, "link": "down"}, "at_step: Input should be greater than or equal to 1"),
    ({"at_step": 5, "link": "sideways"}, "link: Input should be 'down' or 'up'"),
    ({"at_step": 5, "nod": 1, "link": "down"},  # the keys of the section the typo sits in, not the profile's
     "fabric.faults.0.nod: unknown key (valid keys of fabric.faults.0: at_step, node, link, loss_pct, latency_ms)"),
])
def test_a_bad_fault_is_refused_in_one_line(tmp_path: Path, abtune_main: Callable[..., CliResult],
                                            fault: dict[str, Any], expected: str) -> None:
    config = write_config(tmp_path / "run.yaml")
    result = abtune_main("train", str(config), "--launcher", str(profile(tmp_path / "f.yaml", faults=[fault])),
                         "--nproc", "2", "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and expected in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
@pytest.mark.parametrize(("fault", "expected"), [
    ({"at_step": 2, "node": 2, "link": "down"}, "fabric.faults: node 2 does not exist; this run has nodes 0-1"),
    ({"at_step": 6, "node": 1, "link": "down"},
     "fabric.faults: the fault at step 6 comes after the run's last step (train.steps 5): it would never happen; "
     "lower at_step or raise train.steps"),
], ids=["node", "step"])
def test_a_fault_that_cannot_happen_is_refused_in_one_line(tmp_path: Path, abtune_main: Callable[..., CliResult],
                                                          fault: dict[str, Any], expected: str, dry_run: bool) -> None:
    require_fabric()
    config = write_config(tmp_path / "run.yaml", model=MODEL, train={"steps": 5})
    result = abtune_main("train", str(config), "--launcher", str(profile(tmp_path / "f.yaml", faults=[fault])),
                         "--nproc", "2", "--ranks-per-node", "1", "--run-dir", str(tmp_path / "run"), "--no-tracking",
                         *(["--dry-run"] if dry_run else []))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr and result.stdout == "", result.stderr
    assert not (tmp_path / "run").exists()


def kernel_has_netem() -> bool:
    """Asked of the kernel itself: a netem qdisc on the loopback of a namespace that lives for one command."""
    return subprocess.run(["unshare", "--net", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                          capture_output=True).returncode == 0


def test_a_latency_this_kernel_cannot_emulate_is_refused_at_dry_run(tmp_path: Path,
                                                                     abtune_main: Callable[..., CliResult]) -> None:
    """This project's machine (a sandboxed kernel) has no netem: `--dry-run` says so in one line, as the run would
    after building half a fabric; a kernel with netem prints what would start."""
    require_fabric()
    config = write_config(tmp_path / "run.yaml", model=MODEL, train={"steps": 20})
    launcher = profile(tmp_path / "slow.yaml", faults=[{"at_step": 5, "node": 1, "latency_ms": 5}])
    result = abtune_main("train", str(config), "--launcher", str(launcher), "--nproc", "2", "--ranks-per-node", "1",
                         "--run-dir", str(tmp_path / "run"), "--no-tracking", "--dry-run")
    if kernel_has_netem():
        assert result.returncode == 0 and result.stdout.startswith("local: 2 rank(s)"), result.stderr
    else:
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("abtune: error: fabric: a fault's latency_ms needs netem, and this kernel "
                                        "has no netem"), result.stderr


LOSS_STEPS = 20  # the fault at step 10, then as many again: 18 MB crossed the links, 462 segments resent


@pytest.mark.slow
def test_a_link_that_loses_packets_trains_to_the_end_and_tcp_resends_what_it_lost(tmp_path: Path,
                                                                                   abtune_fd: Abtune) -> None:
    """2% of the packets reaching each node are dropped from the start, 5% at node 1 from step 10 (a fault): the run
    trains to its last step, and the nodes' kernels count the TCP segments they had to send again."""
    require_fabric(loss=True)
    before = set(fabric_namespaces())
    config = write_config(tmp_path / "run.yaml", model=MODEL, train={"steps": LOSS_STEPS, "log_every": 5})
    launcher = profile(tmp_path / "lossy.yaml", loss_pct=2, faults=[{"at_step": 10, "node": 1, "loss_pct": 5}])
    abtune_fd("train", str(config), "--launcher", str(launcher), "--nproc", "4", "--ranks-per-node", "2",
              "--run-dir", str(tmp_path / "run"), "--no-tracking")
    summary = read_summary(tmp_path / "run").raw
    link = summary["traffic"]["measured_inter_node_bytes"]["link"]
    assert summary["steps_done"] == LOSS_STEPS and link["loss_pct"] == 2.0
    assert [(f["node"], f["loss_pct"]) for f in link["faults"]] == [(1, 5.0)]
    assert sum(link["tcp_retransmitted_segments"]) > 0, link
    assert set(fabric_namespaces()) == before


@pytest.mark.slow
def test_latency_runs_or_is_refused_in_one_line_where_the_kernel_has_no_netem(tmp_path: Path,
                                                                               abtune_fd: Abtune) -> None:
    """This project's machine (a sandboxed kernel) has no netem; a kernel with it trains with 5 ms more from step 5."""
    require_fabric()
    before = set(fabric_namespaces())
    config = write_config(tmp_path / "run.yaml", model=MODEL, train={"steps": 20, "log_every": 5})
    launcher = profile(tmp_path / "slow.yaml", faults=[{"at_step": 5, "node": 1, "latency_ms": 5}])
    result = abtune_fd("train", str(config), "--launcher", str(launcher), "--nproc", "4", "--ranks-per-node", "2",
                       "--run-dir", str(tmp_path / "run"), "--no-tracking", check=False)
    if "this kernel has no netem" in result.stderr:
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    else:
        assert result.returncode == 0, result.stderr
        link = read_summary(tmp_path / "run").raw["traffic"]["measured_inter_node_bytes"]["link"]
        assert [(f["node"], f["latency_ms"]) for f in link["faults"]] == [(1, 5.0)]
    assert set(fabric_namespaces()) == before


def test_loss_without_iptables_is_refused_in_one_line(tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    require_fabric()
    tools = tmp_path / "bin"  # ip, tc and the venv's commands, but no iptables
    tools.mkdir()
    for tool in ("ip", "tc"):
        (tools / tool).symlink_to(shutil.which(tool))
    config = write_config(tmp_path / "run.yaml")
    result = abtune_main("train", str(config), "--launcher", str(profile(tmp_path / "lossy.yaml", loss_pct=1)),
                         "--nproc", "2", "--run-dir", str(tmp_path / "run"),
                         env={"PATH": f"{Path(sys.executable).parent}:{tools}"})
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "the `iptables` command for loss_pct (apt-get install -y iptables)" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a pytest of its own: the whole suite's, not the fast tier's
def test_the_readme_command_brings_up_iptables_for_the_loss_test_or_skips_it_with_the_reason(tmp_path: Path) -> None:
    """`pytest -q` on a machine without iptables: the suite installs it as it installs SLURM and PostgreSQL
    (tests/system.py), and where that cannot help (here: a PATH without it, whatever is installed) the test
    that loses packets skips, saying why, instead of failing."""
    require_fabric()
    tools = tmp_path / "bin"  # ip, tc and the venv's commands, but no iptables
    tools.mkdir()
    for tool in ("ip", "tc"):
        (tools / tool).symlink_to(shutil.which(tool))
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    test = f"{Path(__file__).name}::test_a_link_that_loses_packets_trains_to_the_end_and_tcp_resends_what_it_lost"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-rs", "-p", "no:cacheprovider", test],
                            cwd=Path(__file__).parent, env={**env, "PATH": f"{Path(sys.executable).parent}:{tools}"},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "1 skipped" in result.stdout, result.stdout + result.stderr
    assert ("the emulated interconnect unavailable: it needs the `iptables` command for loss_pct "
            "(apt-get install -y iptables)") in result.stdout, result.stdout


@pytest.mark.slow
def test_a_study_trial_whose_link_dies_is_retried_from_its_checkpoint_and_completes(
        tmp_path: Path, abtune_fd: Abtune) -> None:
    """The drill a user runs to see what a study does when a node's network fails: the trial's link goes down at
    step 12, its hang detector fails it in one line, the study retries it (`retries.hung`, default 1) from its step
    10 checkpoint on a fresh fabric that replays no fault, and the retry trains to the end (step 20)."""
    require_fabric()
    before, namespaces = host_network(), set(fabric_namespaces())
    url = f"sqlite:///{tmp_path}/optuna.db"
    train = {"steps": 20, "local_batch_size": 16, "eval_every": 20, "log_every": 2, "checkpoint_every": 10,
             "hang": {"floor_s": HANG_FLOOR_S, "untimed_s": 120}}
    study = write_study(tmp_path / "s.yaml", trials=1, references={"paper_defaults": False, "ddp": False},
                        base={**TINY_BASE, "model": {**TINY_BASE["model"], **MODEL}, "train": train},
                        layout={"nproc": 2, "ranks_per_node": 1})
    launcher = profile(tmp_path / "drill.yaml", faults=[{"at_step": 12, "node": 1, "link": "down"}])
    abtune_fd("study", "create", str(study), "--storage", url, cwd=tmp_path)
    result = abtune_fd("study", "run", "tiny", "--storage", url, "--launcher", str(launcher), "--no-tracking",
                       cwd=tmp_path)

    hung, retry = trials_of(url)
    assert hung.state == TrialState.FAIL and hung.user_attrs["retried"] is True
    assert "made no progress for" in hung.user_attrs["fail_reason"], hung.user_attrs["fail_reason"]
    assert retry.state == TrialState.COMPLETE and retry.user_attrs["retry_of"] == hung.number
    assert retry.params == hung.params and retry.user_attrs["resumed_from_step"] == 10
    summary = read_summary(Path(retry.user_attrs["run_dir"])).raw
    assert retry.user_attrs["steps_done"] == 20 and summary["traffic"]["measured_inter_node_bytes"]["link"]["faults"] == []
    assert f"trial {hung.number} FAIL, retried: rank " in result.stdout, result.stdout
    assert set(fabric_namespaces()) == namespaces and host_network() == before
