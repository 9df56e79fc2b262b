"""GPU acceptance in one command: what only a GPU run can check, in one report file.

    python benchmarks/gpu_acceptance.py [--out gpu_acceptance.md] [--device cuda|cpu] [--quick]

On a machine with one CUDA GPU and no network it ends within about 8 minutes (the methods' cells stop at
240 s; on an H200 the models and the calibration took about 90 s more) and writes ONE file, markdown with the whole result as a JSON block at its end,
rewritten after each section, so a run stopped at a time limit still leaves what it measured:

1. **Methods**: every method (abtune/methods/: ddp, ab, ab-nogroups, sbc, powersgd, fp16) trains a short
   schedule of the tiny ViT on scikit-learn's digits through abtune's own Trainer, in fp32 and bf16, under
   NCCL at world size 1 and under gloo with CUDA tensors at 2 ranks on the one GPU (one simulated node per
   rank), and `ab` again at 4 ranks (2 nodes of 2: two groups of two). The schedule (24 steps: warmup 5,
   AB phases of 3, rebounds of 3) decomposes, trains A and B in groups, syncs and rebounds more than once.
   Each cell: passed or the error's line, steps, phases and their ms a step, syncs, decompositions, peak
   GPU memory. A failing cell does not stop the others (its ranks are restarted for the next cell).
2. **Models**: ViT-B/16 and ResNet-50 (224 px, 1000 classes) in fp32 and bf16: a dense step (warmup and
   rebound) against an AB-phase step (every eligible weight factored at a quarter of its rank, A frozen),
   ms a step, images/s and peak memory per phase.
3. **Calibration**: benchmarks/calibrate_cluster.py's measurement (mini ViT, ViT-B/16, ResNet-50; fp32 and
   bf16; batches 16, 64, 128) and the measured cluster description it writes, validated by abtune/timing.py
   and embedded in the report.
4. **Predicted beside measured**: the models' measured images/s beside abtune/timing.py's prediction from
   the calibrated description, from the spec sheet of this GPU when clusters/ has one, and from the shipped
   published A100 figures (clusters/paper-a100-hdr200.yaml).

With `--device cpu` (what the test suite runs: tests/test_gpu_acceptance.py) the same sections run on
the CPU under gloo with tiny models and few steps; `--quick` keeps the methods to fp32 at 2 ranks.
Asked for CUDA without one, it says so in one line and exits 2.

It imports torch and torchvision, the standard library, and what the repository carries (abtune and
benchmarks/calibrate_cluster.py) with abtune's own dependencies on the training path: numpy, PyYAML,
pydantic (with pydantic-core, annotated-types, typing-inspection), scikit-learn (the digits) and tqdm. On
a GPU image without pydantic, bring its wheels: `bash benchmarks/gpu_wheels.sh` (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]  # abtune need not be installed on the GPU machine

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import yaml  # noqa: E402

METHODS = ("ddp", "ab", "ab-nogroups", "sbc", "powersgd", "fp16")
STEPS = 24
AB_SCHEDULE = {"warmup_frac": 0.2, "ab_frac": 0.125, "rebound_frac": 1.0, "lr_rebound_frac": 0.5, "rank_cap": None}
TINY_VIT = {"arch": "vit", "patch_size": 4, "num_layers": 2, "num_heads": 2, "hidden_dim": 32, "mlp_dim": 64,
            "init": "trunc_normal", "init_std": 0.004}
CELL_TIMEOUT_S = {"cuda": 90, "cpu": 180}  # a cell (or the ranks' start) without progress this long is stopped
METHODS_BUDGET_S = {"cuda": 240, "cpu": 900}  # cells not started by then are reported as not run
PG_TIMEOUT_S = 60


# --- 1. every method, through abtune's Trainer, on ranks this script starts ------------------------------
def cell_config(method: str, precision: str, steps: int) -> dict[str, Any]:
    settings = AB_SCHEDULE if method.startswith("ab") else {}
    return {"name": f"{method}-{precision}", "seed": 0, "model": dict(TINY_VIT), "data": {"name": "digits"},
            "train": {"steps": steps, "local_batch_size": 16, "eval_every": steps, "precision": precision,
                      "pg_timeout_s": PG_TIMEOUT_S},
            "optimizer": {"name": "adamw", "lr": 0.003}, "method": {"name": method, **settings}}


def layouts(device: str, quick: bool) -> list[dict[str, Any]]:
    """(backend, world size, ranks per node, cells): NCCL alone on one GPU, gloo with 2 and 4 ranks on it."""
    precisions = ["fp32"] if quick else ["fp32", "bf16"]
    every = [(m, p) for p in precisions for m in METHODS]
    one = "nccl" if device == "cuda" else "gloo"
    found = [{"backend": "gloo", "world": 2, "per_node": 1, "cells": every}]
    if not quick:  # `ab` needs an A and a B group, so at least 2 ranks: a single rank refuses it by design
        found[:0] = [{"backend": one, "world": 1, "per_node": 1, "cells": [c for c in every if c[0] != "ab"]}]
        found.append({"backend": "gloo", "world": 4, "per_node": 2, "cells": [("ab", p) for p in precisions]})
    return found


def rank_worker(spec_path: Path) -> None:
    """One rank: join the process group, train every cell of the spec in turn, rank 0 writes each result."""
    from abtune.config import parse_run_config
    from abtune.dist import DistEnv
    from abtune.runfiles import read_summary
    from abtune.training.trainer import Trainer

    spec = json.loads(spec_path.read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(spec["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(spec["backend"], rank=rank, world_size=world, timeout=timedelta(seconds=PG_TIMEOUT_S))
    env = DistEnv(rank, world, rank % spec["per_node"], rank // spec["per_node"], spec["backend"], device)
    out = Path(spec["out"])
    for method, precision in spec["cells"]:
        name = f"{method}-{precision}"
        (out / f"started-{name}").touch()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        started = time.perf_counter()
        config = parse_run_config(cell_config(method, precision, spec["steps"]))
        (out / name).mkdir(exist_ok=True)
        Trainer(config, out / name, env).train()
        if rank == 0:
            peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
            facts = cell_facts(read_summary(out / name).raw, time.perf_counter() - started, peak)
            (out / f"done-{name}.json").write_text(json.dumps(facts))
    dist.barrier()
    dist.destroy_process_group()


def cell_facts(summary: dict[str, Any], seconds: float, peak_bytes: int | None) -> dict[str, Any]:
    timing = summary["timing"]
    phases = {p: round(t["seconds"] / max(1, t["steps"]) * 1e3, 3) for p, t in timing["by_phase"].items()}
    steps = {p: t["steps"] for p, t in timing["by_phase"].items()}
    traffic = summary["traffic"]["by_phase"]
    return {"ok": True, "steps_done": summary["steps_done"], "ms_per_step_by_phase": phases, "steps_by_phase": steps,
            "phase_order": [p for p, _ in timing["phase_starts"]], "decompositions": len(summary.get("decompositions", [])),
            "factored_weights": max((len(d["ranks"]) for d in summary.get("decompositions", [])), default=0),
            "traffic_phases": sorted(traffic), "top1": summary["final"]["val_top1"],
            "skipped_steps": summary["precision"]["skipped_steps"], "seconds": round(seconds, 2),
            "peak_memory_mb": None if peak_bytes is None else round(peak_bytes / 2**20, 1)}


def check_cell(method: str, world: int, facts: dict[str, Any]) -> list[str]:
    """What a cell must show beyond finishing: AB decomposed, synced and rebounded; groups at 2+ ranks."""
    problems = []
    if facts["steps_done"] != STEPS:
        problems.append(f"trained {facts['steps_done']} of {STEPS} steps")
    if method.startswith("ab"):
        order = facts["phase_order"]
        if order.count("ab") < 2 or "rebound" not in order or not facts["decompositions"]:
            problems.append(f"AB's schedule did not cycle: phases {order}, {facts['decompositions']} decompositions")
        elif not facts.get("factored_weights"):  # every weight kept full rank: the factored layers never ran
            problems.append("AB factored no weight at any decomposition")
        if method == "ab" and world > 1 and "sync" not in facts["traffic_phases"]:
            problems.append("no sync traffic between AB's groups")
    return problems


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_layout(layout: dict[str, Any], device: str, work: Path, steps: int, until: float) -> list[dict[str, Any]]:
    """Every cell of the layout; ranks restarted after a failing cell, which is recorded with its error. Cells
    left when the methods' time budget (`until`, a monotonic time) is spent are recorded as not run."""
    results, remaining = [], list(layout["cells"])
    tag = f"{layout['backend']}-{layout['world']}"
    while remaining:
        if time.monotonic() > until:
            results += [{"method": m, "precision": p, "backend": layout["backend"], "world": layout["world"],
                         "ok": False, "error": "not run: the methods' time budget was spent"} for m, p in remaining]
            break
        out = work / f"{tag}-{len(results)}"
        out.mkdir(parents=True)
        spec = {"device": "cuda:0" if device == "cuda" else "cpu", "backend": layout["backend"],
                "per_node": layout["per_node"], "cells": remaining, "out": str(out), "steps": steps}
        (out / "spec.json").write_text(json.dumps(spec))
        errors = start_ranks(out, layout["world"], CELL_TIMEOUT_S[device])
        for method, precision in list(remaining):
            name = f"{method}-{precision}"
            row = {"method": method, "precision": precision, "backend": layout["backend"], "world": layout["world"]}
            done = out / f"done-{name}.json"
            if done.is_file():
                facts = json.loads(done.read_text())
                problems = check_cell(method, layout["world"], facts)
                results.append({**row, **facts, "ok": not problems, "error": "; ".join(problems)})
                remaining.remove((method, precision))
                continue
            if (out / f"started-{name}").exists():  # the cell that failed: recorded, the rest run again
                results.append({**row, "ok": False, "error": errors or "the ranks ended without a result"})
                remaining.remove((method, precision))
            elif not errors:
                results.append({**row, "ok": False, "error": "not started"})
                remaining.remove((method, precision))
            break
        else:
            break
    return results


def start_ranks(out: Path, world: int, timeout_s: float) -> str:
    """Start `world` ranks of this script on `out`/spec.json; the first error line of a failed rank, or ''.
    Stopped when no cell starts or finishes for `timeout_s` (a hung collective)."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        log = open(out / f"rank{rank}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen([sys.executable, __file__, "--rank-worker", str(out / "spec.json")],
                                       env=env, stdout=log, stderr=subprocess.STDOUT), log))
    deadline, seen = time.monotonic() + timeout_s, 0
    while any(p.poll() is None for p, _ in procs) and time.monotonic() < deadline:
        progress = len(list(out.glob("started-*"))) + len(list(out.glob("done-*")))
        if progress > seen:
            deadline, seen = time.monotonic() + timeout_s, progress
        if any(p.poll() not in (None, 0) for p, _ in procs):  # one failed: give its peers a moment, then stop
            deadline = min(deadline, time.monotonic() + 10)
        time.sleep(0.2)
    timed_out = any(p.poll() is None for p, _ in procs)
    for p, log in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        log.close()
    failed = [rank for rank, (p, _) in enumerate(procs) if p.returncode]
    if not failed:
        return ""
    what = next((line for rank in failed for line in error_lines(out / f"rank{rank}.log")),
                f"exit codes {[p.returncode for p, _ in procs]}")
    return ("timed out; " if timed_out else "") + what[:300]


def error_lines(log: Path) -> list[str]:
    """A rank's exception lines (`SomeError: what`), the last first: the one that ended it."""
    lines = [line.split("]: ", 1)[-1] if line.startswith("[rank") else line for line in log.read_text().splitlines()]
    return [line for line in reversed(lines) if re.match(r"[\w.]+(Error|Exception|Failed|Interrupt)\b", line)]


# --- 2. ViT-B/16 and ResNet-50: dense against AB-phase steps, time and memory per phase -------------------
def model_table(tiny: bool, quick: bool) -> dict[str, tuple[Any, Any, dict[str, int]]]:
    """name: (model config, data shape, batches per precision). Two batches each on a GPU: the first run found
    bf16 steps at batch 64 no faster than at batch 1 (bound by kernel launches?), so the larger batch shows
    AB's phase against the dense step where compute, not launches, decides."""
    from abtune.config import ModelConfig
    from abtune.data import DatasetInfo
    if tiny:
        batches = {"fp32": [8]} if quick else {"fp32": [8], "bf16": [8]}
        return {"vit (tiny)": (ModelConfig(**TINY_VIT), DatasetInfo(10, 8, 3, "digits"), batches),
                "small_cnn": (ModelConfig(arch="small_cnn"), DatasetInfo(10, 8, 3, "digits"), batches)}
    imagenet = DatasetInfo(1000, 224, 3, "imagenet")
    return {"vit_b_16": (ModelConfig(arch="vit_b_16"), imagenet, {"fp32": [32, 128], "bf16": [64, 256]}),
            "resnet50": (ModelConfig(arch="resnet50"), imagenet, {"fp32": [64, 256], "bf16": [128, 256]})}


def models_section(device: torch.device, tiny: bool, quick: bool, steps: int) -> list[dict[str, Any]]:
    from calibrate_cluster import factored, seconds_per_step, training_step

    from abtune.models import build_model, forward_flops_per_sample, parameter_count
    rows = []
    for name, (cfg, info, batches) in model_table(tiny, quick).items():
        for precision, batch in ((p, b) for p, sizes in batches.items() for b in sizes):
            row: dict[str, Any] = {"model": name, "arch": cfg.arch, "precision": precision, "batch": batch,
                                   "forward_flops_per_sample": forward_flops_per_sample(cfg, info)}
            for phase, model in (("dense", build_model(cfg, info)), ("ab", factored(build_model(cfg, info)))):
                try:
                    row[phase] = phase_step(model, info, precision, batch, steps, device,
                                            training_step, seconds_per_step)
                    row[phase]["params"] = parameter_count(model)
                except Exception as error:  # noqa: BLE001 - a failing phase is a result of the check
                    row[phase] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
                del model
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            rows.append(row)
            print(f"models: {name} {precision} batch {batch}: {row['dense']} / ab {row['ab']}", flush=True)
    return rows


def phase_step(model: Any, info: Any, precision: str, batch: int, steps: int, device: torch.device,
               training_step: Any, seconds_per_step: Any) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    step = training_step(model, info, precision, batch, device)
    for _ in range(3):
        step()
    seconds = seconds_per_step(step, steps, device)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    model.to("cpu")
    return {"ms_per_step": round(seconds * 1e3, 3), "images_per_s": round(batch / seconds, 1),
            "peak_memory_mb": None if peak is None else round(peak, 1)}


# --- 3. the calibration, 4. predicted beside measured ------------------------------------------------------
def calibration_section(device: torch.device, tiny: bool, quick: bool) -> dict[str, Any]:
    from calibrate_cluster import describe, device_name, measure

    from abtune.timing import Cluster
    models = ["quickstart"] if tiny else ["minivit", "vit_b_16", "resnet50"]
    precisions = ["fp32"] if tiny else ["fp32", "bf16"]
    batches, steps = ([1, 2, 4], 2) if tiny else ([16, 64, 128], 10)  # batch 1 is launch-bound on a GPU
    if quick:
        precisions, batches, steps = precisions[:1], batches[:2], 1
    measured = measure(models, precisions, batches, steps, device)
    links = {"nodes": 1, "accelerators_per_node": 1, "inter_node": {"gbit_per_s": 25.0, "latency_us": 25.0},
             "intra_node": {"gbit_per_s": 200.0, "latency_us": 1.0}}
    description = describe("acceptance-measured", device_name(device), measured, batches, steps, links)
    Cluster.model_validate(description)  # what abtune/timing.py would load
    return description


def predictions_section(rows: list[dict[str, Any]], calibrated: dict[str, Any], gpu: str) -> list[dict[str, Any]]:
    """Each measured dense step beside timing.py's step for the same model, batch and precision."""
    from abtune.errors import ConfigError
    from abtune.timing import Cluster, load_cluster, spec_sheet_for, step_compute
    sources = {"calibrated here": Cluster.model_validate(calibrated), "published A100": load_cluster("paper-a100-hdr200")}
    sheet = spec_sheet_for(gpu)
    if sheet is not None:
        sources[f"spec sheet ({sheet.name})"] = sheet
    table = []
    for row in rows:
        if "ms_per_step" not in row["dense"]:
            continue
        summary = {"config": {"model.arch": row["arch"], "train.precision": row["precision"]},
                   "timing": {"forward_flops_per_sample": row["forward_flops_per_sample"], "local_batch_size": row["batch"]}}
        entry = {"model": row["model"], "precision": row["precision"], "batch": row["batch"],
                 "measured_images_per_s": row["dense"]["images_per_s"], "predicted": {}}
        for label, cluster in sources.items():
            try:
                compute = step_compute(summary, cluster)
            except ConfigError as error:
                entry["predicted"][label] = {"error": str(error)[:200]}
                continue
            seconds = compute.seconds(row["batch"])
            entry["predicted"][label] = {"images_per_s": round(row["batch"] / seconds, 1), "source": str(compute.source)[:300],
                                         "measured_over_predicted": round(row["dense"]["images_per_s"] * seconds / row["batch"], 3)}
        table.append(entry)
    return table


# --- the report ------------------------------------------------------------------------------------------
def report_markdown(result: dict[str, Any]) -> str:
    lines = [f"# GPU acceptance: {result['device']}", "",
             f"{result['when']}, torch {result['torch']}, {result['elapsed_s']:.0f} s; "
             f"{result['passed']} of {result['cells']} method cells passed; sections done: "
             f"{', '.join(result['sections_done'])}.", "",
             "## Methods (a short schedule through abtune's Trainer)", "",
             "| method | precision | backend | ranks | result | phases (ms/step) | peak MB |", "|---|---|---|---|---|---|---|"]
    for c in result["methods"]:
        phases = ", ".join(f"{p} {ms:g}" for p, ms in c.get("ms_per_step_by_phase", {}).items())
        lines.append(f"| {c['method']} | {c['precision']} | {c['backend']} | {c['world']} | "
                     f"{'passed' if c['ok'] else 'FAILED: ' + c['error']} | {phases} | {c.get('peak_memory_mb') or '-'} |")
    lines += ["", "## Models: dense (warmup, rebound) against AB's phase", "",
              "| model | precision | batch | dense ms/step | dense images/s | dense peak MB | ab ms/step | ab images/s | "
              "ab peak MB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["models"]:
        cells = [str(r[phase].get(k, r[phase].get("error", ""))) for phase in ("dense", "ab")
                 for k in ("ms_per_step", "images_per_s", "peak_memory_mb")]
        lines.append(f"| {r['model']} | {r['precision']} | {r['batch']} | " + " | ".join(cells) + " |")
    lines += ["", "## Predicted (abtune/timing.py) beside measured", "",
              "| model | precision | batch | measured images/s | predicted by | predicted images/s | measured/predicted |",
              "|---|---|---|---|---|---|---|"]
    for p in result["predictions"]:
        for label, got in p["predicted"].items():
            lines.append(f"| {p['model']} | {p['precision']} | {p['batch']} | {p['measured_images_per_s']} | {label} | "
                         f"{got.get('images_per_s', got.get('error'))} | {got.get('measured_over_predicted', '')} |")
    lines += ["", "## The calibrated cluster description", "", "```yaml",
              yaml.safe_dump(result["calibration"], sort_keys=False).rstrip(), "```", "",
              "## Everything, as JSON", "", "```json", json.dumps(result, indent=1), "```", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_acceptance.md"))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="methods in fp32 at 2 ranks only, one step a timing, one precision")
    parser.add_argument("--methods-only", action="store_true", help="only the methods' cells (a rerun after a fix)")
    parser.add_argument("--no-methods", action="store_true", help="only models, calibration and predictions")
    parser.add_argument("--work", type=Path, default=None, help="where the runs go (default: a new temporary folder)")
    parser.add_argument("--rank-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_worker is not None:
        rank_worker(args.rank_worker)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_acceptance: CUDA was asked for but torch sees no CUDA GPU; run it on a GPU machine, "
              "or --device cpu for the CPU path", file=sys.stderr)
        sys.exit(2)
    began = time.perf_counter()
    methods_until = time.monotonic() + METHODS_BUDGET_S[args.device]
    tiny = args.device == "cpu"
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_acceptance-"))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    result: dict[str, Any] = {"device": gpu, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "torch": torch.__version__, "methods": [], "models": [], "calibration": {},
                              "predictions": [], "cells": 0, "passed": 0, "sections_done": []}

    def write(section: str) -> None:  # after every section, so a run stopped at its limit still leaves a report
        result["sections_done"].append(section)
        result["elapsed_s"] = time.perf_counter() - began
        args.out.write_text(report_markdown(result))

    for layout in [] if args.no_methods else layouts(args.device, args.quick):
        result["methods"] += run_layout(layout, args.device, work, STEPS, methods_until)
        result["cells"], result["passed"] = len(result["methods"]), sum(c["ok"] for c in result["methods"])
        write(f"methods {layout['backend']} x{layout['world']}")
    for cell in result["methods"]:
        print(f"methods: {cell['method']} {cell['precision']} {cell['backend']} x{cell['world']}: "
              f"{'passed' if cell['ok'] else 'FAILED ' + cell['error']}", flush=True)
    if args.methods_only:
        sys.exit(0 if result["passed"] == result["cells"] else 1)
    result["models"] = models_section(device, tiny, args.quick, steps=1 if args.quick else 2 if tiny else 10)
    write("models")
    result["calibration"] = calibration_section(device, tiny, args.quick)
    result["predictions"] = predictions_section(result["models"], result["calibration"], gpu)
    write("calibration and predictions")
    print(f"wrote {args.out}: {result['passed']} of {result['cells']} method cells passed, "
          f"{result['elapsed_s']:.0f} s")
    sys.exit(0 if result["passed"] == result["cells"] else 1)


if __name__ == "__main__":
    main()
