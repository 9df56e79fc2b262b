"""One rank of a run: `python -m abtune.training.worker RUN_DIR [--resume]`.

Reads the resolved config from RUN_DIR/config.yaml and the torch.distributed variables from the
environment. A failure is written to RUN_DIR/failures/rank_N.txt (one line for the launcher to
show) before the process exits non-zero.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from abtune.config import load_run_config
from abtune.dist import init_distributed, shutdown
from abtune.errors import AbtuneError

CONFIG_FILE = "config.yaml"
FAILURES_DIR = "failures"


QUIET_VARIABLE = "ABTUNE_LAUNCHED"  # set by a launcher that reports failures itself


def record_failure(run_dir: Path, rank: int, message: str, details: str = "", deliberate: bool = True) -> None:
    """`deliberate`: an abtune error (bad value, NaN loss); otherwise a crash, often a peer's death seen in a collective."""
    folder = run_dir / FAILURES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    kind = "error" if deliberate else "crash"
    (folder / f"{kind}_rank_{rank}.txt").write_text(message + ("\n\n" + details if details else ""))


def finish_together() -> None:
    """Every rank reaches the end before any tears its process group down.

    A rank that destroys its gloo group while a peer still flushes the last collective can make that
    peer abort ("terminate called without an active exception", seen once in CI on a resumed run).
    Not metered: the summary, written before, is the record; this costs one empty round trip.
    """
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def run_rank(run_dir: Path, resume: bool) -> None:
    from abtune.training.trainer import Trainer  # torch-heavy; imported once the process is a rank

    config = load_run_config(run_dir / CONFIG_FILE)
    env = init_distributed(config.train.pg_timeout_s)
    try:
        Trainer(config, run_dir, env).train(resume=resume)
        finish_together()
    except AbtuneError as error:
        record_failure(run_dir, env.rank, str(error))
        raise
    except Exception as error:
        record_failure(run_dir, env.rank, f"rank {env.rank}: {type(error).__name__}: {error}", traceback.format_exc(),
                       deliberate=False)
        raise
    finally:
        shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="abtune-worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    try:
        run_rank(args.run_dir, args.resume)
    except AbtuneError as error:
        if not os.environ.get(QUIET_VARIABLE):
            print(f"abtune worker: {error}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
