"""How abtune's processes end (abtune/exiting.py): the command runs what a normal exit runs (threads that must
finish, exit handlers) and skips only the interpreter's teardown; a rank skips the handlers too. Each case is a
small Python of its own (no torch), since the point is how a process ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PROGRAM = """
import atexit, sys, threading, time
from pathlib import Path
from abtune.exiting import {function}

out = Path(sys.argv[1])

class Canary:  # collected only when the interpreter tears its modules down
    def __del__(self):
        (out / "finalized").write_text("yes")

canary = Canary()
atexit.register(lambda: (out / "handler").write_text("ran"))

def late_writer():
    time.sleep(0.3)
    (out / "thread").write_text("finished")

threading.Thread(target=late_writer).start()  # not a daemon: a normal exit waits for it
print("printed before the exit", end="")  # no newline: still in the buffer when the process ends
{function}(3)
"""


def _end_with(function: str, folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROGRAM.format(function=function), str(folder)], capture_output=True,
                          text=True, timeout=60, cwd=REPO)


def test_a_command_ends_after_its_threads_and_exit_handlers_without_the_teardown(tmp_path: Path) -> None:
    ended = _end_with("exit_after_handlers", tmp_path)
    assert ended.returncode == 3 and ended.stdout == "printed before the exit", ended.stderr
    assert (tmp_path / "thread").read_text() == "finished"  # joined, as Python's exit joins it
    assert (tmp_path / "handler").read_text() == "ran"
    assert not (tmp_path / "finalized").exists()  # the teardown (seconds after torch) was skipped


def test_a_rank_ends_at_once_with_its_output_flushed(tmp_path: Path) -> None:
    ended = _end_with("exit_without_finalizing", tmp_path)
    assert ended.returncode == 3 and ended.stdout == "printed before the exit", ended.stderr
    assert not (tmp_path / "handler").exists() and not (tmp_path / "finalized").exists()


def test_the_installed_command_is_the_entry_that_skips_the_teardown() -> None:
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"abtune": "abtune.cli:entry"}
