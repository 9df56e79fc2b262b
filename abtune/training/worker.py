"""One rank of a run: `python -m abtune.training.worker RUN_DIR [--resume]`.

Reads the resolved config from RUN_DIR/config.yaml and the torch.distributed variables from the
environment. A failure is written to RUN_DIR/failures/rank_N.txt (one line for the launcher to
show) before the process exits non-zero.

The process ends with os._exit, without finalizing the interpreter. DDP keeps its process group
alive until the process ends (a reference cycle in C++ that Python's gc cannot see), and a gloo
worker thread may still be releasing the tensors of the last collective. If that thread needs the
GIL once finalization has begun, Python ends it with pthread_exit and C++ aborts the whole process:
"terminate called without an active exception", after a run that succeeded (seen in CI on rank 1 of
a finished fp16 run; pytorch/pytorch#179291). Everything a rank writes is closed before it returns.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from abtune.config import load_run_config
from abtune.errors import AbtuneError, TrainingFailed
from abtune.exiting import exit_without_finalizing
from abtune.runfiles import CONFIG_FILE, FAILURES_DIR
from abtune.runlock import join_run
from abtune.training.hang import STORE_LINGER_S, ProgressBoard, until_peers_leave

QUIET_VARIABLE = "ABTUNE_LAUNCHED"  # set by a launcher that reports failures itself


def record_failure(run_dir: Path, rank: int, message: str, details: str = "", deliberate: bool = True) -> None:
    """`deliberate`: an abtune error (bad value, NaN loss); otherwise a crash, often a peer's death seen in a collective."""
    folder = run_dir / FAILURES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    kind = "error" if deliberate else "crash"
    (folder / f"{kind}_rank_{rank}.txt").write_text(message + ("\n\n" + details if details else ""))


def finish_together() -> None:
    """Every rank reaches the end before any tears its process group down, so no rank leaves a peer
    waiting in a last collective. Not metered: the summary, written before, is the record; this costs
    one empty round trip."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def run_rank(run_dir: Path, resume: bool) -> None:
    # torch-heavy: imported once the process is a rank, so that launchers importing this module
    # (for FAILURES_DIR, QUIET_VARIABLE) do not pay for torch
    from abtune import strict_device
    from abtune.dist import StoreBoard, init_distributed, shutdown
    from abtune.training.trainer import Trainer

    config = load_run_config(run_dir / CONFIG_FILE)
    rank = int(os.environ.get("RANK", "0"))
    held = None
    trainer = None
    try:
        if rank == 0:
            held = join_run(run_dir)  # a resume is refused while this rank lives, even if its launcher dies
        env = init_distributed(config.train.pg_timeout_s)  # may refuse: a task without a GPU of its own
        with strict_device.strict_devices(strict_device.requested()):
            trainer = Trainer(config, run_dir, env)
            # one rank waits for no peer; and the debug launcher's breakpoints may take hours
            if env.world_size > 1 and config.train.hang.enabled:
                board = StoreBoard(env.world_size, config.train.pg_timeout_s)
                linger_s = config.train.hang.floor_s + STORE_LINGER_S
                trainer.hang.start(lambda message: end_hung_rank(run_dir, rank, message, board, linger_s), board)
            trainer.train(resume=resume)
        finish_together()
    except AbtuneError as error:
        record_failure(run_dir, rank, str(error))
        raise
    except Exception as error:
        record_failure(run_dir, rank, f"rank {rank}: {type(error).__name__}: {error}", traceback.format_exc(),
                       deliberate=False)
        raise
    finally:
        if trainer is not None:
            trainer.hang.stop()
        shutdown()
        if held is not None:
            held.close()


def end_hung_rank(run_dir: Path, rank: int, message: str, board: ProgressBoard, linger_s: float) -> NoReturn:
    """From the hang detector's thread: the main thread is blocked in C++ and cannot be interrupted, so
    the process ends here (abtune/training/hang.py); rank 0, which serves the rendezvous store, once its peers
    are done with it (at most `linger_s` later)."""
    record_failure(run_dir, rank, message)
    if not os.environ.get(QUIET_VARIABLE):
        print(f"abtune worker: {message}", file=sys.stderr)
    if rank == 0:
        until_peers_leave(board, rank, linger_s)
    exit_without_finalizing(TrainingFailed.exit_code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="abtune-worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    # A Ctrl-C is for the launcher, which stops the ranks (SIGTERM): cold and warm ranks alike, whatever
    # disposition they inherited (a command started with `nohup ... &` passes SIGINT on ignored).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable()  # a crash inside torch's C++ (SIGSEGV, SIGABRT) still shows the Python stack
    try:
        run_rank(args.run_dir, args.resume)
    except AbtuneError as error:
        if not os.environ.get(QUIET_VARIABLE):
            print(f"abtune worker: {error}", file=sys.stderr)
        return error.exit_code
    except Exception:  # recorded with its stack in failures/ by run_rank
        if not os.environ.get(QUIET_VARIABLE):
            traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    exit_without_finalizing(main())
