"""Does a run resumed from a checkpoint on a GPU continue exactly where it stopped?

The CPU suite checks resuming bit for bit (tests/test_resume_after_sync.py), but there the only random
generator dropout draws from is the CPU's; on a GPU dropout draws from the CUDA generator, whose state the
checkpoint saves with `torch.cuda.get_rng_state_all()`. Four arms per method, 2 gloo ranks on one device,
a tiny ViT with dropout 0.1, deterministic kernels:

  full       24 steps, checkpoints at 12 and 24
  again      the same from scratch: shows the run itself is deterministic (else nothing below means anything)
  resumed    full's run dir without step 24, resumed from step 12
  wrong-rng  as resumed, but step 12's saved generator state of the device replaced: shows that state matters

Passes when `again` and `resumed` equal `full` bit for bit and `wrong-rng` does not.

    python benchmarks/gpu_resume.py --out gpu_resume.md            # on a GPU machine
    python benchmarks/gpu_resume.py --device cpu --out resume.md   # the same check on this machine's CPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before torch loads CUDA

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from gpu_acceptance import TINY_VIT, free_port  # noqa: E402 - beside this script

WORLD = 2
STEPS = 24
CHECKPOINT_AT = 12
DROPOUT = 0.1  # every training step draws from the device's generator
AB_SCHEDULE = {"warmup_frac": 0.25, "ab_frac": 0.25, "rebound_frac": 1.0, "lr_rebound_frac": 0.5, "rank_cap": None}
METHODS = ("ddp", "ab")
RANKS_TIMEOUT_S = 180


def run_config(method: str) -> dict[str, Any]:
    settings = AB_SCHEDULE if method == "ab" else {}
    return {"name": f"resume-{method}", "seed": 0, "model": {**TINY_VIT, "dropout": DROPOUT}, "data": {"name": "digits"},
            "train": {"steps": STEPS, "local_batch_size": 16, "eval_every": STEPS, "checkpoint_every": CHECKPOINT_AT,
                      "keep_checkpoints": 3, "pg_timeout_s": 60},
            "optimizer": {"name": "adamw", "lr": 0.003}, "method": {"name": method, **settings}}


def rank_worker(spec_path: Path) -> None:
    """One rank: train (or resume) the spec's run dir to STEPS."""
    from abtune.config import parse_run_config
    from abtune.dist import DistEnv
    from abtune.training.trainer import Trainer

    spec = json.loads(spec_path.read_text())
    torch.use_deterministic_algorithms(True)
    rank = int(os.environ["RANK"])
    device = torch.device(spec["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    env = DistEnv(rank, WORLD, rank, 0, "gloo", device)
    Trainer(parse_run_config(run_config(spec["method"])), Path(spec["run_dir"]), env).train(resume=spec["resume"])
    dist.destroy_process_group()


def train(run_dir: Path, method: str, device: str, resume: bool) -> None:
    spec = run_dir.parent / f"{run_dir.name}.json"
    spec.write_text(json.dumps({"run_dir": str(run_dir), "method": method, "device": device, "resume": resume}))
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        log = open(run_dir.parent / f"{run_dir.name}-rank{rank}.log", "w")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen([sys.executable, __file__, "--rank-worker", str(spec)], env=env,
                                       stdout=log, stderr=subprocess.STDOUT), log))
    for proc, log in procs:
        try:
            proc.wait(timeout=RANKS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    if any(proc.returncode for proc, _ in procs):
        tail = (run_dir.parent / f"{run_dir.name}-rank0.log").read_text().splitlines()[-5:]
        raise RuntimeError(f"{run_dir.name}: ranks exited {[p.returncode for p, _ in procs]}: {' | '.join(tail)}")


def final_weights(run_dir: Path) -> list[dict[str, torch.Tensor]]:
    folder = run_dir / "checkpoints" / f"step_{STEPS:08d}"
    return [torch.load(folder / f"rank_{r}.pt", map_location="cpu", weights_only=False)["model"] for r in range(WORLD)]


def largest_difference(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> float:
    worst = 0.0
    for left, right in zip(a, b, strict=True):
        if left.keys() != right.keys():
            return float("inf")
        for key, value in left.items():
            if value.is_floating_point():
                worst = max(worst, (value.float() - right[key].float()).abs().max().item())
            elif not torch.equal(value, right[key]):
                return float("inf")
    return worst


def cut_back(source: Path, target: Path) -> None:
    """`source` as it was when stopped after step CHECKPOINT_AT: the later checkpoint and summary gone."""
    shutil.copytree(source, target)
    shutil.rmtree(target / "checkpoints" / f"step_{STEPS:08d}")
    (target / "summary.json").unlink(missing_ok=True)


def scramble_generator(run_dir: Path, device: str) -> None:
    """Replace the device's saved generator state at CHECKPOINT_AT (the CUDA one on a GPU) in every rank."""
    folder = run_dir / "checkpoints" / f"step_{CHECKPOINT_AT:08d}"
    for rank in range(WORLD):
        path = folder / f"rank_{rank}.pt"
        state = torch.load(path, map_location="cpu", weights_only=False)
        if device.startswith("cuda"):  # a CUDA generator's state is its seed and offset, 8 bytes each
            state["rng"]["cuda"] = [saved.clone().index_fill_(0, torch.tensor([0]), int(saved[0]) ^ 0xFF)
                                    for saved in state["rng"]["cuda"]]
        else:
            state["rng"]["torch"] = torch.Generator().manual_seed(12345).get_state()
        torch.save(state, path)


def check_method(method: str, device: str, work: Path) -> dict[str, Any]:
    arms = {name: work / f"{method}-{name}" for name in ("full", "again", "resumed", "wrong-rng")}
    errors = {}
    for name, run_dir in arms.items():
        if name in ("full", "again"):
            run_dir.mkdir()
        elif not errors.get("full"):
            cut_back(arms["full"], run_dir)
            if name == "wrong-rng":
                scramble_generator(run_dir, device)
        else:
            continue
        errors[name] = train_arm(run_dir, method, device, resume=name not in ("full", "again"))
    if errors["full"]:
        return {"method": method, "ok": False, "error": f"full: {errors['full']}"}
    full = final_weights(arms["full"])
    diffs = {name: largest_difference(full, final_weights(arms[name])) for name in ("again", "resumed", "wrong-rng")
             if not errors[name]}
    ok = diffs.get("again") == 0.0 and diffs.get("resumed") == 0.0 and diffs.get("wrong-rng", 0.0) > 0.0
    failed = "; ".join(f"{name}: {error}" for name, error in errors.items() if error)
    return {"method": method, "ok": ok, "error": failed, **{f"max |diff| {k}": v for k, v in diffs.items()}}


def train_arm(run_dir: Path, method: str, device: str, resume: bool) -> str:
    """'' when the arm trained, else its error: one failing arm must not hide what the others show."""
    try:
        train(run_dir, method, device, resume)
    except RuntimeError as error:
        return str(error)[:300]
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("gpu_resume.md"))
    parser.add_argument("--rank-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_worker:
        rank_worker(args.rank_worker)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_resume: CUDA was asked for but torch sees no CUDA GPU; run it on a GPU machine, or --device cpu "
              "for the same check on the CPU", file=sys.stderr)
        sys.exit(2)
    device = "cuda:0" if args.device == "cuda" else "cpu"
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in METHODS:
            rows.append(check_method(method, device, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "CPU"
    lines = [f"# Resume on {name}", "",
             f"torch {torch.__version__}, {WORLD} gloo ranks, {STEPS} steps resumed from {CHECKPOINT_AT}, "
             f"dropout {DROPOUT}, deterministic kernels; {time.perf_counter() - started:.0f} s", "",
             "| method | passed | again vs full | resumed vs full | wrong generator vs full | error |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        cells = [row.get(f"max |diff| {k}", "") for k in ("again", "resumed", "wrong-rng")]
        lines.append(f"| {row['method']} | {row['ok']} | " + " | ".join(f"{c:.3g}" if c != "" else "" for c in cells)
                     + f" | {row.get('error', '')} |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(0 if all(row["ok"] for row in rows) else 1)


if __name__ == "__main__":
    main()
