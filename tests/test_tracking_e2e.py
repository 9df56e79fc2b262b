"""MLflow tracking end to end: real `abtune train` runs, a real `mlflow server` (also stopped in the
middle of a run), and a tracking URL with a password that must never show. `abtune ui` on a study's stores:
tests/test_study_screenshots.py."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from abtune.config import load_run_config
from abtune.launch.local import free_port, launch
from abtune.runfiles import read_summary
from abtune.tracking import LaunchInfo, open_tracking
from abtune.tracking.records import (
    COMPRESSION_RATIO,
    HEADLINE,
    HEADLINE_SECTION,
    INTER_NODE_MB,
    TOP1_PERCENT,
    VERSUS_DDP,
)
from abtune.tracking.servers import Service, start_mlflow_server, stop, wait_ready
from abtune.training.hooks import hook_spec, read_metrics, write_hook_specs
from tests.conftest import CliResult, run_cli, write_config
from tests.gate import gate

pytestmark = pytest.mark.slow

SECRET = "s3cr3t-t0ken"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
AB_RUN = {"method": {"name": "ab"}, "train": {"steps": 60, "eval_every": 20, "log_every": 5}}
GATE_STEP = 20
NO_TRACKING_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_abtune_train_records_params_metrics_and_plots_in_the_default_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, abtune_main_fd: Callable[..., CliResult]) -> None:
    """In this process (MLflow imported once; `abtune train` through its entry point: the next test)."""
    for name in NO_TRACKING_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    config = write_config(tmp_path / "run.yaml", **AB_RUN)
    result = abtune_main_fd("train", str(config), "--nproc", "2", "--ranks-per-node", "1", "--run-dir", "run",
                            "--set", "train.cluster=paper-a100-hdr200", cwd=tmp_path,
                            env={"MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.2"})
    assert result.returncode == 0, result.stderr
    summary = read_summary(tmp_path / "run").raw
    assert (tmp_path / "mlflow.db").is_file() and (tmp_path / "mlartifacts" / "tiny").is_dir()
    assert "control" not in summary["traffic"]["by_phase"]  # tracking adds no collective

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["abtune.logging"] == "complete"
    params, schedule = run.data.params, summary["schedule"]
    for key in ("warmup_steps", "ab_steps", "rebound_steps", "lr_rebound_steps", "ab_cycles"):
        assert params[f"method.{key}"] == str(schedule[key])
    assert (params["world_size"], params["nodes"], params["ranks_per_node"], params["group_size"]) == ("2", "2", "1", "1")
    assert params["method.sigma_cutoff"] == "0.1" and params["model.hidden_dim"] == "16"
    assert len(params["git_commit"]) >= 40 and run.data.tags["abtune.node"] == socket.gethostname()

    rid = run.info.run_id
    assert [s for s, _ in _history(client, rid, "train/loss")] == list(range(5, 61, 5))
    assert [s for s, _ in _history(client, rid, "val/top1")] == [20, 40, 60]
    inter = [v for _, v in _history(client, rid, "traffic/inter_node_bytes")]
    assert inter == sorted(inter) and inter[-1] > 0
    last_log = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "log"][-1]
    assert inter[-1] == last_log["inter_node_bytes"]  # rank 0's count, as in metrics.jsonl
    traffic, metrics = summary["traffic"], run.data.metrics
    assert metrics["inter_node_bytes"] == traffic["inter_node_bytes"]["mean"]
    assert metrics["intra_node_bytes"] == traffic["intra_node_bytes"]["mean"]
    assert metrics["total_bytes"] == traffic["total_bytes"]["mean"]
    assert metrics["bytes_sync"] == traffic["by_phase"]["sync"]["total"]["mean"]
    assert metrics["reduction_vs_ddp"] == pytest.approx(traffic["reduction_vs_ddp"])
    assert metrics["best_top1"] == summary["best_top1"] and metrics["final_top1"] == summary["final"]["val_top1"]
    assert metrics["wall_seconds"] >= summary["timing"]["train_seconds"] > 0
    held = summary["memory"]["held_bytes_by_phase"]
    assert metrics["held_bytes_warmup"] == held["warmup"]["total"] > 0
    assert metrics["held_bytes_ab"] == held["ab"]["total"] > 0
    assert len(_history(client, rid, "ab/compression")) == len(summary["decompositions"])
    assert any(k.startswith(f"system/{socket.gethostname()}/cpu_utilization") for k in metrics)
    # the predicted time on the paper's nodes says where its compute comes from: a tiny fp32 ViT has no
    # published rate there, so it is assumed, and the run's report says so
    predicted = summary["predicted"]
    assert (predicted["compute_source"], predicted["step_floor_seconds"]) == ("assumed", 0.002)
    assert metrics["predicted/train_seconds"] == predicted["train_seconds"]
    assert metrics["predicted/step_floor_seconds"] == 0.002
    tags = run.data.tags
    assert tags["abtune.predicted.compute_source"] == "assumed" and tags["abtune.predicted.cluster"] == "paper-a100-hdr200"
    assert tags["abtune.predicted.compute_source_detail"] == predicted["compute_source_detail"]
    assert "(assumed compute)" in result.stdout and "note: compute on paper-a100-hdr200 is not measured" in result.stdout
    # The result at a glance: in human units, at step 0 (a bar with its number), in the section the UI lists first.
    headline = {key: _history(client, rid, key) for key in HEADLINE}
    inter_mb = traffic["training_inter_node_bytes"] / 1e6
    two_decimals = {"abs": 0.005}
    assert headline == {TOP1_PERCENT: [(0, pytest.approx(100 * summary["final"]["val_top1"], **two_decimals))],
                        INTER_NODE_MB: [(0, pytest.approx(inter_mb, **two_decimals))],
                        COMPRESSION_RATIO: [(0, pytest.approx(summary["compression"]["trained_model_ratio"], **two_decimals))],
                        VERSUS_DDP: [(0, pytest.approx(traffic["reduction_vs_ddp"], **two_decimals))]}
    sections = sorted({key.rpartition("/")[0] for key in metrics if "/" in key and not key.startswith("system/")})
    assert sections[0] == HEADLINE_SECTION, sections  # the MLflow UI sorts its chart sections this way
    ddp_mb = traffic["ddp_reference_inter_node_bytes"] / 1e6
    assert run.data.tags["mlflow.note.content"] == (
        f"**run** (ab, 60 steps): top-1 **{summary['final']['val_top1']:.4f}**, training inter-node traffic "
        f"**{inter_mb:,.2f} MB** per rank ({inter_mb / ddp_mb:.2f}x DDP's {ddp_mb:,.2f} MB), trained-model compression "
        f"**{summary['compression']['trained_model_ratio']:.2f}:1**")

    folder = Path(client.download_artifacts(rid, "", str(tmp_path / "download")))
    assert read_summary(folder).raw["traffic"]["inter_node_bytes"] == traffic["inter_node_bytes"]
    for name in ("accuracy_loss", "traffic_per_phase", "spectra"):
        data = (folder / "plots" / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name


def _rest(base: str, endpoint: str, payload: dict[str, Any] | None = None, **query: str) -> dict[str, Any]:
    url = f"{base}/api/2.0/mlflow/{endpoint}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@dataclass
class MlflowServer:
    """One `mlflow server` on one store for this module's tests (its start-up: seconds of CPU): a test may stop
    it; `running()` starts it again, on the same store and port, for the next."""

    backend: str
    port: int
    log: Path
    service: Service | None = None

    def running(self) -> Service:
        if self.service is None or self.service.process.poll() is not None:
            self.service = start_mlflow_server(self.backend, port=self.port, log=self.log)
            wait_ready(self.service)
        return self.service


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory, _mlflow_template: Path) -> Iterator[MlflowServer]:
    folder = tmp_path_factory.mktemp("mlflow-server")
    shutil.copy(_mlflow_template, folder / "mlflow.db")
    shared = MlflowServer(f"sqlite:///{folder / 'mlflow.db'}", free_port(), folder / "server.log")
    yield shared
    if shared.service is not None:
        stop(shared.service)


@pytest.fixture
def server(mlflow_server: MlflowServer) -> Service:
    return mlflow_server.running()


def test_a_run_against_a_real_server_reads_back_over_rest_and_never_shows_the_password(
        tmp_path: Path, server: Service) -> None:
    config = write_config(tmp_path / "run.yaml", name="served", **AB_RUN)
    uri = server.url.replace("http://", f"http://alice:{SECRET}@")
    result = run_cli("train", str(config), "--nproc", "2", "--ranks-per-node", "1", "--run-dir", str(tmp_path / "run"),
                     "--tracking-uri", uri)
    assert f"at {server.url} " in result.stdout

    experiment = _rest(server.url, "experiments/get-by-name", experiment_name="served")["experiment"]
    (run,) = _rest(server.url, "runs/search", {"experiment_ids": [experiment["experiment_id"]]})["runs"]
    rid = run["info"]["run_id"]
    assert run["info"]["status"] == "FINISHED"
    loss = _rest(server.url, "metrics/get-history", run_id=rid, metric_key="train/loss")["metrics"]
    assert sorted(int(m["step"]) for m in loss) == list(range(5, 61, 5))
    summary = read_summary(tmp_path / "run").raw
    metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
    assert metrics["inter_node_bytes"] == summary["traffic"]["inter_node_bytes"]["mean"]
    listed = _rest(server.url, "artifacts/list", run_id=rid, path="plots")["files"]
    assert {f["path"] for f in listed} == {"plots/accuracy_loss.png", "plots/traffic_per_phase.png", "plots/spectra.png"}

    # The password went nowhere: not in params, tags, artifacts, output, run folder or server log.
    everything = [result.stdout, result.stderr, json.dumps(run), server.log.read_text()]
    folder = MlflowClient(server.url).download_artifacts(rid, "", str(tmp_path / "download"))
    files = [p for p in [*Path(folder).rglob("*"), *(tmp_path / "run").rglob("*")] if p.is_file()]
    everything += [p.read_bytes().decode(errors="replace") for p in files]
    assert not [text[:200] for text in everything if SECRET in text]


def _logged_through(client: MlflowClient, run_id: str, step: int) -> bool:
    steps = [s for s, _ in _history(client, run_id, "train/loss")]
    return bool(steps) and steps[-1] >= step


def _stop_server_at_the_gate(run_dir: Path, service: Service, run_id: str) -> threading.Thread:
    """Once rank 0 waits at the gate and its points up to there reached the store, stop the server."""
    client = MlflowClient(service.url)

    def work() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (
                (run_dir / "gate.paused").exists() and _logged_through(client, run_id, GATE_STEP)):
            time.sleep(0.1)
        stop(service)
        (run_dir / "gate.go").touch()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def test_a_server_outage_mid_run_loses_no_metric(tmp_path: Path, mlflow_server: MlflowServer,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail fast while the server is down
    service = mlflow_server.running()
    tracking = open_tracking(service.url)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(write_config(tmp_path / "run.yaml", **AB_RUN).read_text())
    run_id = tracking.start_run(load_run_config(run_dir / "config.yaml"), experiment="outage", run_name="r",
                                launch_info=LaunchInfo("local", 2, 1))
    spec = tracking.hook_spec(run_id)
    spec["options"]["flush_seconds"] = 0.2
    write_hook_specs(run_dir, [spec, hook_spec(gate, step=GATE_STEP)])
    stopper = _stop_server_at_the_gate(run_dir, service, run_id)
    launch(run_dir, 2, 1)  # completes although the store vanished at step 20
    stopper.join()
    assert read_summary(run_dir).raw["steps_done"] == 60
    assert tracking.finish_run(run_id, run_dir, "FINISHED") == "incomplete"  # still down: warned, kept

    client = MlflowClient(mlflow_server.running().url)  # the same store, again at the same address
    assert [s for s, _ in _history(client, run_id, "train/loss")] == [5, 10, 15, 20]  # the outage's gap
    assert tracking.finish_run(run_id, run_dir, "FINISHED") == "replayed"
    assert [s for s, _ in _history(client, run_id, "train/loss")] == list(range(5, 61, 5))
    assert [s for s, _ in _history(client, run_id, "val/top1")] == [20, 40, 60]
    assert client.get_run(run_id).data.tags["abtune.logging"] == "replayed"
