"""Warm rank start-up (abtune/launch/warm.py): ranks forked from a server that imported torch and
abtune once behave as ranks started cold, on real gloo runs of 2 ranks."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from abtune.config import load_run_config
from abtune.errors import TrainingFailed
from abtune.launch import fabric, local, warm
from abtune.launch.profiles import FabricProfile
from abtune.rundir import prepare_run_dir
from abtune.runfiles import read_summary
from tests import warm_fixture
from tests.conftest import write_config

NPROC = 2
session_server = pytest.mark.skipif(not warm.enabled(), reason="the suite runs cold (ABTUNE_WARM_START=0)")
AB = {"name": "ab", "warmup_frac": 0.25, "ab_frac": 0.25, "rebound_frac": 0.5, "lr_rebound_frac": 0.5,
      "sigma_cutoff": 0.3}
warm_server = warm_fixture.warm_server  # the session's server (a fresh one imports torch and MLflow again)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], warm.WarmRank]]:
    """Every rank the launcher got from the warm server (args, rank); a cold rank is not listed."""
    ranks: list[tuple[list[str], warm.WarmRank]] = []
    spawn = warm.spawn

    def recording(args: list[str], env: dict[str, str], namespace: str | None = None) -> warm.WarmRank | None:
        rank = spawn(args, env, namespace)
        if rank is not None:
            ranks.append((args, rank))
        return rank

    monkeypatch.setattr(warm, "spawn", recording)
    return ranks


@pytest.fixture
def own_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A server of this test's own (not the session's), so that what it served is all this test's; it ends
    with its owner."""
    with _owner(monkeypatch, start=True) as path:
        yield path


@pytest.fixture
def own_owner(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This test owns the server that ranks started under it would fork from, none started yet (a fresh
    server's imports are seconds of CPU, and its stop waits for them)."""
    with _owner(monkeypatch, start=False) as path:
        yield path


@contextlib.contextmanager
def _owner(monkeypatch: pytest.MonkeyPatch, start: bool) -> Iterator[Path]:
    with warm_fixture.owned_by_this_test(monkeypatch, start) as path:
        yield path
    assert not path.parent.exists()
    assert _processes_naming(str(path)) == []


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def run(tmp: Path, name: str, **sections: Any) -> Path:
    run_dir = prepare_run_dir(load_run_config(write_config(tmp / f"{name}.yaml", **sections)), tmp / name, False)
    local.launch(run_dir, NPROC, NPROC)
    return run_dir


def results(run_dir: Path) -> dict[str, Any]:
    """summary.json without its clock readings (every value named *seconds*, at any depth)."""
    return _without_times(read_summary(run_dir).raw)


def _without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if "seconds" not in k}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


@pytest.mark.slow  # trains: left out of the fast subset
def test_warm_ranks_equal_cold_ones_and_carry_nothing_into_the_next_run(
        tmp_path: Path, warm_server: None, started: list[tuple[list[str], warm.WarmRank]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Run B cold; then, in one warm server, run A (another seed and method) and B again: B's summary
    is B's cold one, value for value. (That a server ends with its owner: `own_server`.)"""
    b = {"method": AB, "seed": 3}
    with monkeypatch.context() as cold:
        cold.setenv(warm.WARM_VARIABLE, "0")
        cold_b = run(tmp_path, "cold-b", **b)
    assert started == []
    run(tmp_path, "warm-a", method={"name": "ddp"}, seed=11, train={"steps": 25})
    warm_b = run(tmp_path, "warm-b", **b)
    assert len(started) == 2 * NPROC and len({rank.pid for _, rank in started}) == 2 * NPROC
    assert all(rank.returncode == 0 for _, rank in started)
    assert results(warm_b) == results(cold_b)
    assert results(warm_b)["final"]["val_top1"] > 0


@pytest.mark.slow  # starts processes (a job, ranks): the whole suite's, not the fast tier's
@session_server
def test_a_killed_rank_fails_only_its_run(tmp_path: Path, started: list[tuple[list[str], warm.WarmRank]]) -> None:
    """Two runs side by side from the session's server; SIGKILL one rank of the long one: that run fails
    with the cold launcher's message, the other finishes, and the server starts the next run."""
    outcome: dict[str, BaseException | None] = {}

    def long_run() -> None:
        try:
            run(tmp_path, "long", train={"steps": 100000, "log_every": 1})
        except BaseException as error:  # noqa: B036 - handed to the test's thread
            outcome["long"] = error
        else:
            outcome["long"] = None

    thread = threading.Thread(target=long_run)
    thread.start()
    metrics = tmp_path / "long" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text()) and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.2)
    victim = next(rank for args, rank in started if args[0] == str(tmp_path / "long") and rank.poll() is None)
    assert os.getpgid(victim.pid) == os.getpgid(0)  # a Ctrl-C or killpg of the launcher's group reaches it
    short = run(tmp_path, "short", seed=5)  # side by side with the long one's ranks
    os.kill(victim.pid, signal.SIGKILL)
    thread.join(timeout=120)
    assert isinstance(outcome["long"], TrainingFailed)
    assert str(outcome["long"]).endswith("was killed by SIGKILL")
    assert all(rank.poll() is not None for args, rank in started if args[0] == str(tmp_path / "long"))
    assert results(short)["final"]["val_top1"] > 0
    after = run(tmp_path, "after", seed=6)
    assert (after / "summary.json").exists()
    assert sum(args[0] == str(after) for args, _ in started) == NPROC  # still warm


@pytest.mark.slow  # trains: left out of the fast subset
def test_ranks_of_an_emulated_node_start_warm_inside_its_namespace(
        tmp_path: Path, warm_server: None, started: list[tuple[list[str], warm.WarmRank]],
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Each warm rank moves itself into its node's namespace as `ip netns exec` would (network, /sys and
    /etc/hosts): its bytes cross the emulated link, and its summary is the cold rank's, value for value."""
    if fabric.missing_requirements():
        pytest.skip(f"the emulated interconnect needs {fabric.missing_requirements()}")
    config = load_run_config(write_config(tmp_path / "run.yaml", method=AB, seed=4))
    summaries = []
    for mode in ("cold", "warm"):
        with monkeypatch.context() as setting:
            setting.setenv(warm.WARM_VARIABLE, "0" if mode == "cold" else "1")
            run_dir = prepare_run_dir(config, tmp_path / mode, False)
            local.launch(run_dir, NPROC, 1, fabric=FabricProfile())
        summaries.append(read_summary(run_dir).raw)
    assert [args[0] for args, _ in started] == [str(tmp_path / "warm")] * NPROC
    cold, hot = summaries
    for summary in summaries:  # every byte between the ranks crossed the node's link
        measured = summary["traffic"]["measured_inter_node_bytes"]
        assert measured["payload"] > 0 and min(measured["by_node_tx"]) > 0
    assert _without_times(hot["traffic"]["inter_node_bytes"]) == _without_times(cold["traffic"]["inter_node_bytes"])
    assert hot["final"] == cold["final"]
    # each peer has a name inside the node's /etc/hosts: torch's store warns of no connection it accepts
    assert "hostname of the client socket cannot be retrieved" not in capfd.readouterr().err


@pytest.mark.slow  # starts processes (a job, ranks): the whole suite's, not the fast tier's
def test_a_python_path_with_another_abtune_starts_cold(tmp_path: Path, own_server: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A PYTHONPATH entry holding another `abtune` would make a cold rank import that one: the server
    refuses, and the launcher starts the rank cold. So do different settings read at import."""
    other = tmp_path / "other"
    (other / "abtune").mkdir(parents=True)
    (other / "abtune" / "__init__.py").write_text("")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # the suite's own folder holds abtune, and comes first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(other), os.environ.get("PYTHONPATH")]))}
    assert warm.spawn([str(tmp_path / "never-runs")], env) is None
    assert warm.spawn([str(tmp_path / "never-runs")], {**os.environ, "LD_PRELOAD": "libnothing.so"}) is None


@pytest.mark.slow  # trains: left out of the fast subset
def test_a_command_in_a_session_of_its_own_owns_a_server(tmp_path: Path, own_owner: Path) -> None:
    """A server refuses ranks of a launcher in another session (their process group cannot join it), so
    a command started in a new session (`study run` from a terminal) owns a server of its own and its
    ranks start warm; in the owner's session the outer server is used."""
    import subprocess
    import sys

    probe = "from abtune.launch import warm\nwith warm.owned_server() as path:\n    print(path)\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH")]))}

    def owned(new_session: bool) -> str:
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True,
                              start_new_session=new_session, timeout=120).stdout.strip()

    assert owned(new_session=False) == "None"
    path = owned(new_session=True)
    assert path != "None" and path != str(own_owner)
    assert not Path(path).parent.exists()  # the command's server ended with it


def test_a_killed_owner_s_folder_is_removed_by_the_next_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL skips an owner's cleanup; the next owner removes the folder of an owner that is gone (and only
    that: a live owner's folder stays)."""
    import signal
    import subprocess
    import sys

    for variable in (warm.SOCKET_VARIABLE, warm.WARM_VARIABLE, warm.OWNER_VARIABLE):
        monkeypatch.delenv(variable, raising=False)
    probe = "import sys, time\nfrom abtune.launch import warm\nwith warm.owned_server() as path:\n" \
            "    print(path, flush=True)\n    time.sleep(600)\n"
    killed = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True)
    live = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True)
    try:
        dead_folder, live_folder = (Path(p.stdout.readline().strip()).parent for p in (killed, live))
        assert dead_folder.is_dir() and live_folder.is_dir()
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert dead_folder.is_dir()  # nobody cleaned up after it
        with warm.owned_server() as path:
            assert path is not None and path.parent.is_dir()
            assert not dead_folder.exists() and live_folder.is_dir()
        assert not path.parent.exists()
    finally:
        live.kill()
        live.wait(timeout=30)


def test_ensure_server_starts_nothing_without_an_owner_with_warm_start_off_or_in_a_folder_that_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ensure_server()` starts the server of the process's owner; with none to start it answers False at once,
    no Python started (a server is seconds of imports)."""
    for variable in (warm.SOCKET_VARIABLE, warm.WARM_VARIABLE, warm.OWNER_VARIABLE):
        monkeypatch.delenv(variable, raising=False)
    assert warm.ensure_server() is False  # no owner exported a socket
    monkeypatch.setenv(warm.SOCKET_VARIABLE, str(tmp_path / "gone" / "server.sock"))
    assert warm.ensure_server() is False  # its owner's folder is gone: nothing to start it in
    (tmp_path / "gone").mkdir()
    monkeypatch.setenv(warm.WARM_VARIABLE, "0")
    assert warm.ensure_server() is False  # warm start off
    assert list((tmp_path / "gone").iterdir()) == []
