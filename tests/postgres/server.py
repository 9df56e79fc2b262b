"""Drive pg.sh from Python: a throw-away PostgreSQL server on 127.0.0.1 (no pytest needed; the
benchmarks use it too). See fixture.py for the pytest side."""

from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
from pathlib import Path

from abtune.redact import redact
from tests.system import INSTALL_TIMEOUT_S, one_install_at_a_time

PG_SH = Path(__file__).resolve().parent / "pg.sh"
ROLE = DATABASE = "abtune"
UP_TIMEOUT_S = 180
DOWN_TIMEOUT_S = 180


@dataclasses.dataclass(frozen=True)
class PostgresServer:
    state_dir: Path
    port: int
    password: str = dataclasses.field(repr=False)
    host: str = "127.0.0.1"
    user: str = ROLE
    database: str = DATABASE

    def url(self, database: str | None = None, driver: str = "psycopg2") -> str:
        """SQLAlchemy URL, e.g. postgresql+psycopg2://abtune:SECRET@127.0.0.1:PORT/abtune."""
        return f"postgresql+{driver}://{self.user}:{self.password}@{self.host}:{self.port}/{database or self.database}"

    @classmethod
    def from_state_dir(cls, state_dir: Path) -> PostgresServer:
        return cls(state_dir=state_dir, port=int((state_dir / "port").read_text()),
                   password=(state_dir / "password").read_text().strip())


class PgShError(RuntimeError):
    pass


def installed() -> bool:
    bin_dir = os.environ.get("ABTUNE_PG_BIN")
    return bool(glob.glob(f"{bin_dir}/postgres" if bin_dir else "/usr/lib/postgresql/*/bin/postgres"))


def run_pg_sh(command: str, state_dir: Path | None = None, timeout: float = UP_TIMEOUT_S) -> str:
    """Run `pg.sh COMMAND [STATE_DIR]`; its output is appended to STATE_DIR/pg-sh.log (or returned
    in the error). Output goes to a file, not a pipe: the server it starts must not hold our pipe."""
    log = (state_dir / "pg-sh.log") if state_dir else Path(os.devnull)
    args = ["bash", str(PG_SH), command, *([str(state_dir)] if state_dir else [])]
    with open(log, "a") as fh:
        try:
            proc = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
    if rc != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:]) if state_dir else ""
        what = "timed out" if rc is None else f"failed (rc={rc})"
        raise PgShError(redact(f"`pg.sh {' '.join(args[2:])}` {what}:\n{tail}"))
    return log.read_text() if state_dir else ""


def up(state_dir: Path) -> PostgresServer:
    """Install if missing (needs root), then start the server in state_dir (created if needed)."""
    if not installed():
        with one_install_at_a_time():
            run_pg_sh("install", timeout=INSTALL_TIMEOUT_S)
    state_dir.mkdir(parents=True, exist_ok=True)
    run_pg_sh("up", state_dir)
    return PostgresServer.from_state_dir(state_dir)


def down(state_dir: Path) -> None:
    run_pg_sh("down", state_dir, timeout=DOWN_TIMEOUT_S)


def status(state_dir: Path) -> bool:
    try:
        run_pg_sh("status", state_dir, timeout=60)
    except PgShError:
        return False
    return True
