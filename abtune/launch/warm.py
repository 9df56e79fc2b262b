"""Warm rank start-up: ranks forked from a server that has imported torch and abtune once.

A cold rank is `python -m abtune.training.worker RUN_DIR`: an interpreter that imports torch, torchvision
and abtune (rank 0 of a tracked run MLflow too), seconds of CPU per rank, four ranks per trial. A warm rank is a fork of a
server that did those imports once and never ran a torch op, so the child starts with no process group,
model, RNG draw, meter or thread of any earlier rank: the same state a cold rank starts with.

    with owned_server():              # the abtune command: a server for it, started on first use
        rank = spawn(args, env)       # a WarmRank (Popen's poll/wait/terminate/kill), or None: start cold

Who owns the server: the process that set ABTUNE_WARM_SOCKET (the `abtune` command, or the test
session through tests/conftest.py). Any launcher under it (the command itself, or a submitit job of a
study trial) starts the server on first use; the server stops once its owner has ended or asked it to,
and its ranks have all ended: a rank that outlives its launcher (a killed `study run`) is still reaped
and its exit status still delivered. The socket lives in a private (0700) temporary folder that the
server removes when it ends. The server runs in its own process group of the starter's session; each
rank joins its launcher's process group, so a Ctrl-C or a killpg reaches warm ranks as it reaches cold
ones. A server takes ranks from its own session only: a command in another session than the outer
owner owns a server of its own. ABTUNE_WARM_START=0 turns all of this off (every rank starts cold).

Protocol (SOCK_SEQPACKET, one JSON message each way): the launcher sends the rank's argv, environment,
working directory, interpreter and Python path, with its stdin, stdout and stderr as SCM_RIGHTS; the
server forks, and answers with the child's pid and a pidfd (for signals that cannot hit a reused pid),
or with a refusal (start cold). The child waits for the launcher's word that it took the rank: a launcher
that stopped waiting for the reply (a server still preloading on a busy machine) has started that rank
cold, and the child ends without running. When the child ends, the server sends its exit code (negative:
the signal) and closes the connection.

Refused (the launcher starts that rank cold): a different interpreter, a Python path that would import
another copy of a module the server already holds, different thread or allocator settings that take
effect at import, or a server that is no longer single-threaded. A rank on an emulated interconnect
names its node's network namespace; its fork moves itself in as `ip netns exec` would (launch/netns.py),
which needs a server running as root.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.machinery
import json
import os
import select
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import psutil

from abtune.exiting import exit_without_finalizing
from abtune.launch import netns
from abtune.launch.base import exported
from abtune.launch.pids import process_alive

WARM_VARIABLE = "ABTUNE_WARM_START"  # "0": every rank starts cold
SOCKET_VARIABLE = "ABTUNE_WARM_SOCKET"  # the server's socket; set by its owner, inherited by launchers
OWNER_VARIABLE = "ABTUNE_WARM_OWNER"  # pid of the process whose end stops the server
WORKER_MODULE = "abtune.training.worker"
SOCKET_NAME = "ranks.sock"
FOLDER_PREFIX = "abtune-warm-"
START_LOCK = "start.lock"
LOG_FILE = "server.log"
PRELOAD = (WORKER_MODULE, "abtune.training.trainer", "abtune.tracking.hook", "abtune.study.pruning")
# Rank 0 logs to MLflow when its launcher tracks, which exports the store's URI: with that variable set, MLflow, and
# for a database store its SQL layer too (SQLAlchemy, Alembic: 1.5 s of CPU in every tracked rank 0 otherwise).
# Without it no rank imports MLflow (a --no-tracking command's server saves 2-3 s of CPU).
TRACKING_PRELOAD = ("mlflow",)
DATABASE_STORE_PRELOAD = ("mlflow.store.tracking.sqlalchemy_store",)
# Read when torch, OpenBLAS, the allocators or Python start: a fork inherits the server's values.
IMPORT_TIME_VARIABLES = ("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "KMP_AFFINITY",
                         "GOMP_CPU_AFFINITY", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONHASHSEED", "MALLOC_CONF")
# The server's own settings: ranks get one OpenMP thread by default, and pyarrow's jemalloc (imported
# with mlflow) would otherwise start a background thread: a fork takes only the forking thread along.
SERVER_ENVIRONMENT = {"OMP_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
MESSAGE_BYTES = 1 << 20
TAKEN = {"taken": True}  # the launcher to the forked rank: it waits for this rank, which may run
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 120.0  # a server still preloading (seconds; more on a busy machine) answers after that
LOST_EXIT_CODE = 1  # the server ended before its rank: the rank's own status is lost


def enabled() -> bool:
    return os.environ.get(WARM_VARIABLE, "1") != "0"


# --- the owner --------------------------------------------------------------------------------------


@contextlib.contextmanager
def owned_server(start: bool = False, wait: bool = False) -> Iterator[Path | None]:
    """Ranks started under this block (here or in child processes) fork from one server of this process,
    started on first use (`start`: now) and stopped at the end of the block; yields its socket. Nothing
    (None) when warm start is off or an outer owner (a test session) provides a server already.
    `wait`: at the end, block until the server has ended."""
    if not enabled() or _outer_server_takes_our_ranks():
        yield None
        return
    _remove_dead_owners_folders()
    folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
    path = folder / SOCKET_NAME
    try:
        with exported({SOCKET_VARIABLE: str(path), OWNER_VARIABLE: str(os.getpid())}):  # then an outer owner's again
            if start:
                ensure_server(path)
            yield path
    finally:
        server = stop_server(path)
        if server is None:
            shutil.rmtree(folder, ignore_errors=True)
        elif wait:
            wait_for_exit(server, STOP_TIMEOUT_S)
            shutil.rmtree(folder, ignore_errors=True)  # gone already, unless the server had to be killed


def ensure_server(path: Path | None = None) -> bool:
    """Start the server at `path` (default: the one this process's ranks fork from) unless one listens, and
    wait until it does, so that the first rank finds it ready. False when warm start is off, no owner set a
    socket, or the server did not start."""
    if not enabled():
        return False
    if path is None:
        named = os.environ.get(SOCKET_VARIABLE)
        if not named:
            return False
        path = Path(named)
    conn = _server_connection(path, dict(os.environ))
    if conn is None:
        return False
    conn.close()
    return True


def _remove_dead_owners_folders() -> None:
    """An owner killed by SIGKILL skips its cleanup: its folder (named after its pid) stays behind, empty
    or with a lock and a log. Remove those of this user whose owner is gone and where no server listens."""
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*-*"):
        pid = folder.name.removeprefix(FOLDER_PREFIX).partition("-")[0]
        with contextlib.suppress(OSError, ValueError):
            if folder.stat().st_uid == os.getuid() and not process_alive({"pid": int(pid)}) and not _listening(folder / SOCKET_NAME):
                shutil.rmtree(folder, ignore_errors=True)


def _listening(path: Path) -> bool:
    try:
        _connect(path).close()
    except OSError:
        return False
    return True


def _outer_server_takes_our_ranks() -> bool:
    """An outer owner (a test session) provides a server, and it is in our session: a server refuses the
    ranks of a launcher in another session (a `study run` started as a terminal would, in a session of its
    own), so such a command owns a server of its own instead of starting every rank cold."""
    owner = os.environ.get(OWNER_VARIABLE)
    if not os.environ.get(SOCKET_VARIABLE) or owner is None:
        return False
    try:
        return os.getsid(int(owner)) == os.getsid(0)
    except (ProcessLookupError, PermissionError, ValueError):
        return False  # the outer owner has ended: its server stops too


def stop_server(path: Path) -> int | None:
    """Ask the server at `path` to stop once its ranks have ended; its pid, or None if none listens."""
    try:
        with _connect(path) as conn:
            conn.settimeout(START_TIMEOUT_S)  # a server still preloading answers after that
            conn.send(json.dumps({"stop": True}).encode())
            return int(json.loads(conn.recv(MESSAGE_BYTES))["pid"])
    except (OSError, ValueError, KeyError):
        return None


def wait_for_exit(pid: int, timeout_s: float) -> None:
    """Until process `pid` (not a child) has ended; SIGKILL after `timeout_s` (its ranks live on)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if not select.select([pidfd], [], [], timeout_s)[0]:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            select.select([pidfd], [], [], timeout_s)
    finally:
        os.close(pidfd)


# --- the launcher -----------------------------------------------------------------------------------


class WarmRank:
    """A forked rank as the local launcher sees a subprocess.Popen: poll, wait, terminate, kill."""

    def __init__(self, conn: socket.socket, pid: int, pidfd: int) -> None:
        self.conn, self.pid, self.pidfd = conn, pid, pidfd
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"warm rank {self.pid}", timeout or 0.0)
            self._read(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read(self, timeout: float | None) -> None:
        if self.conn.fileno() < 0:  # the server is gone: wait for the rank itself
            if select.select([self.pidfd], [], [], timeout)[0]:
                self._finish(LOST_EXIT_CODE)
            return
        if not select.select([self.conn], [], [], timeout)[0]:
            return
        message = self.conn.recv(MESSAGE_BYTES)
        if message:
            self._finish(int(json.loads(message)["exit_code"]))
        else:
            self.conn.close()

    def _finish(self, code: int) -> None:
        self.returncode = code
        self.conn.close()
        os.close(self.pidfd)


def spawn(args: list[str], env: dict[str, str], namespace: str | None = None) -> WarmRank | None:
    """`python -m abtune.training.worker ARGS` with `env`, forked warm (inside network `namespace`, if
    given); None: start it cold."""
    path = os.environ.get(SOCKET_VARIABLE)
    if not enabled() or not path:
        return None
    conn = _server_connection(Path(path), env)
    if conn is None:
        return None
    request = {"args": args, "env": env, "cwd": os.getcwd(), "executable": os.path.realpath(sys.executable),
               "package": package_folder(), "path": _path_prefix(env), "launcher": os.getpid(), "group": os.getpgid(0),
               "netns": namespace}
    conn.settimeout(REPLY_TIMEOUT_S)
    try:
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        message, fds, _, _ = socket.recv_fds(conn, MESSAGE_BYTES, 1)
        reply = json.loads(message) if message else {"refused": "the server ended"}
    except (OSError, ValueError):
        conn.close()
        return None
    if "pid" not in reply or len(fds) != 1:
        conn.close()
        for fd in fds:
            os.close(fd)
        return None
    try:
        conn.send(json.dumps(TAKEN).encode())
    except OSError:  # the server is gone; the fork, not taken, ends without running
        conn.close()
        os.close(fds[0])
        return None
    return WarmRank(conn, int(reply["pid"]), fds[0])


def package_folder() -> str:
    """Where this process's abtune comes from: a launcher and a server from two checkouts (an editable
    install pointing elsewhere) would speak two versions of this handshake, so the server refuses."""
    return os.path.dirname(os.path.realpath(__file__))


def _path_prefix(env: dict[str, str]) -> list[str]:
    """What `python -m` puts before the interpreter's own path: the working directory, then PYTHONPATH."""
    entries = [os.getcwd(), *env.get("PYTHONPATH", "").split(os.pathsep)]
    return [os.path.abspath(entry) for entry in entries if entry]


def _server_connection(path: Path, env: dict[str, str]) -> socket.socket | None:
    """Connect, starting the server first if none listens (one starter at a time)."""
    with contextlib.suppress(OSError):
        return _connect(path)
    if not path.parent.is_dir():
        return None
    with (path.parent / START_LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(OSError):
            return _connect(path)
        path.unlink(missing_ok=True)  # a killed server's socket
        return _start_server(path, env)


def _connect(path: Path) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        raise
    return conn


def _start_server(path: Path, env: dict[str, str]) -> socket.socket | None:
    owner = os.environ.get(OWNER_VARIABLE, str(os.getpid()))
    server_env = dict(env)
    server_env.update(SERVER_ENVIRONMENT, OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    with (path.parent / LOG_FILE).open("a") as log:
        process = subprocess.Popen([sys.executable, "-m", __name__, "serve", str(path), owner], env=server_env,
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=log, process_group=0)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError):
            return _connect(path)
        time.sleep(0.05)
    return None


# --- the server -------------------------------------------------------------------------------------


class Server:
    """Forks ranks on request; see the module's docstring. Single-threaded: one selector loop."""

    def __init__(self, path: Path, owner: int) -> None:
        self.path = path
        self.children: dict[int, socket.socket] = {}
        self.stopping = False
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(str(path))  # before preloading: launchers queue meanwhile
        self.listener.listen(64)
        self.owner = os.pidfd_open(owner)
        self.wakeup_read, wakeup_write = socket.socketpair()
        self.wakeup_write = wakeup_write
        wakeup_write.setblocking(False)
        self.wakeup_read.setblocking(False)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup socket hears it
        signal.signal(signal.SIGTERM, lambda *_: self._stop())
        signal.set_wakeup_fd(wakeup_write.fileno())
        self.prefix = _path_prefix(dict(os.environ))
        self.base_path = [entry for entry in sys.path if os.path.abspath(entry) not in self.prefix]
        self.selector = selectors.DefaultSelector()
        self.refusal = _preload()

    def serve(self) -> None:
        self.selector.register(self.listener, selectors.EVENT_READ, self._accept)
        self.selector.register(self.wakeup_read, selectors.EVENT_READ, self._reap)
        self.selector.register(self.owner, selectors.EVENT_READ, self._owner_ended)
        while not (self.stopping and not self.children):
            for key, _ in self.selector.select():
                key.data()
        self._close()

    def _owner_ended(self) -> None:
        self.selector.unregister(self.owner)  # stays readable: once is enough
        self._stop()

    def _stop(self) -> None:
        if not self.stopping:
            self.stopping = True
            self.path.unlink(missing_ok=True)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(10.0)
        try:
            message, fds, _, _ = socket.recv_fds(conn, MESSAGE_BYTES, 3)
            request = json.loads(message)
        except (OSError, ValueError):
            conn.close()
            return
        if request.get("stop"):
            self._stop()
            with contextlib.suppress(OSError):
                conn.send(json.dumps({"pid": os.getpid()}).encode())
            conn.close()
            return
        try:
            self._start_rank(conn, request, fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _start_rank(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        refusal = "stopping" if self.stopping else self.refusal or _threads() or self._mismatch(request)
        if refusal or len(fds) != 3:
            print(f"refused a rank (it starts cold): {refusal or 'no stdio'}", flush=True)  # the server's log
            with contextlib.suppress(OSError):
                conn.send(json.dumps({"refused": refusal or "no stdio"}).encode())
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._become_rank(conn, request, fds)
        pidfd = os.pidfd_open(pid)
        try:
            socket.send_fds(conn, [json.dumps({"pid": pid}).encode()], [pidfd])
        except OSError:
            pass  # the launcher is gone; the rank runs on and is reaped as any other
        finally:
            os.close(pidfd)
        self.children[pid] = conn

    def _mismatch(self, request: dict[str, Any]) -> str | None:
        try:
            if os.getsid(request["launcher"]) != os.getsid(0):
                return "the launcher is in another session: its process group cannot take the rank"
        except ProcessLookupError:
            return "the launcher is gone"
        if request["executable"] != os.path.realpath(sys.executable):
            return f"another interpreter ({request['executable']})"
        if request.get("package") != package_folder():
            return f"abtune from another checkout ({request.get('package')})"
        for name in IMPORT_TIME_VARIABLES:
            if request["env"].get(name) != os.environ.get(name):
                return f"{name} differs"
        if request.get("netns"):
            refusal = netns.can_enter(request["netns"])
            if refusal:
                return refusal
        return _path_mismatch(request["path"], self.prefix, self.base_path, _loaded_origins())

    def _reap(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self.wakeup_read.recv(4096):
                pass
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.send(json.dumps({"exit_code": os.waitstatus_to_exitcode(status)}).encode())
                conn.close()

    def _become_rank(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> NoReturn:
        """In the child: the process state of `python -m abtune.training.worker ARGS`, then run it."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # as worker.main sets it: a Ctrl-C is for the launcher
            if not _launcher_took(conn):
                os._exit(LOST_EXIT_CODE)  # it started this rank cold: a second rank of that number would run
            for sock in (self.listener, self.wakeup_read, self.wakeup_write, conn, *self.children.values()):
                sock.close()
            os.close(self.owner)
            os.setpgid(0, request["group"])  # the launcher's: a Ctrl-C or killpg reaches the rank as a cold one
            if request.get("netns"):
                netns.enter(request["netns"])
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            _take_over(request, self.base_path)
            code = _run_worker(request["args"])
        except BaseException:  # noqa: B036 - the child must never return into the server's loop
            with contextlib.suppress(BaseException):
                import traceback

                traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def _close(self) -> None:
        self.listener.close()
        self.path.unlink(missing_ok=True)
        folder = self.path.parent
        for name in (START_LOCK, LOG_FILE):
            (folder / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()


def _launcher_took(conn: socket.socket) -> bool:
    """In the child, before it runs: whether the launcher took this fork as its rank. A launcher that gave
    up waiting for the reply closed the connection (or ended), and its rank runs cold; the fork that would
    run beside it, with the same rank number and port, takes the rendezvous store from the cold rank, which
    then waits for peers that have finished already."""
    conn.settimeout(None)  # the launcher answers at once, or has closed the connection
    try:
        message = conn.recv(MESSAGE_BYTES)
        return bool(message) and json.loads(message) == TAKEN
    except (OSError, ValueError):
        return False


def _loaded_origins() -> dict[str, str | None]:
    """The sys.path entry of every top-level module this process has imported."""
    return {name: _origin(module) for name, module in list(sys.modules.items()) if "." not in name}


def _path_mismatch(prefix: list[str], own_prefix: list[str], base_path: list[str],
                   origins: dict[str, str | None]) -> str | None:
    """Would `prefix` (working directory, PYTHONPATH) make a cold rank import one of the server's modules
    (`origins`) from elsewhere? Each module comes from the first entry that holds it, else from the base
    path (where an editable install's finder also answers)."""
    decided: set[str] = set()
    for entry in prefix:
        names = _importable(entry) & origins.keys() - decided
        for name in names:
            if origins[name] not in (None, entry):
                return f"{entry} holds another {name}"
        decided |= names
    for name in origins.keys() - decided:
        if origins[name] in own_prefix and _base_origin(name, base_path) != origins[name]:
            return f"{name} would not come from {origins[name]}"
    return None


def _base_origin(name: str, base_path: list[str]) -> str | None:
    """Where a top-level module comes from without a prefix: the first finder that knows it, the path
    finder searching only `base_path`."""
    for finder in sys.meta_path:
        search = base_path if finder is importlib.machinery.PathFinder else None
        with contextlib.suppress(Exception):  # a third-party finder's fault means: not known here
            spec = finder.find_spec(name, search)
            if spec is not None:
                return _entry_of(spec.origin) if spec.has_location else None
    return None


def _origin(module: Any) -> str | None:
    """The sys.path entry a top-level module was loaded from (None: built in, or a namespace package)."""
    file = getattr(module, "__file__", None)
    return _entry_of(file) if file else None


def _entry_of(file: str) -> str:
    """The sys.path entry that top-level module or package file `file` is found in."""
    folder = os.path.dirname(os.path.abspath(file))
    return os.path.dirname(folder) if os.path.basename(file) == "__init__.py" else folder


def _importable(entry: str) -> set[str]:
    """The top-level modules and regular packages in folder `entry` (a namespace portion yields to them)."""
    suffixes = (".py", ".pyc", *importlib.machinery.EXTENSION_SUFFIXES)
    try:
        names = os.listdir(entry)
    except OSError:
        return set()
    modules = {name.partition(".")[0] for name in names if name.endswith(suffixes)}
    return modules | {name for name in names if os.path.isfile(os.path.join(entry, name, "__init__.py"))}


def _take_over(request: dict[str, Any], base_path: list[str]) -> None:
    """The launcher's working directory, environment, Python path and stdio buffering; fresh entropy
    for Python's and numpy's global generators (torch's default generator was never drawn from)."""
    import random

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[:] = [*request["path"], *base_path]
    interactive = os.isatty(1)
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdout.reconfigure(line_buffering=interactive, write_through=unbuffered)
    sys.stderr.reconfigure(line_buffering=True, write_through=unbuffered)
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    import torch

    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _run_worker(args: list[str]) -> int:
    """What `python -m abtune.training.worker ARGS` runs (the module is preloaded, so not run again)."""
    worker = sys.modules[WORKER_MODULE]
    sys.argv = [worker.__file__ or WORKER_MODULE, *args]
    try:
        exit_without_finalizing(worker.main(args))
    except SystemExit as done:  # argparse
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


def _preload() -> str | None:
    """Import what every rank imports; a reason to refuse every request if that failed."""
    try:
        for name in preloaded_modules(os.environ):
            importlib.import_module(name)
        from abtune.methods import METHODS  # each method's torch half, named by the registry

        for _, where in METHODS.values():
            importlib.import_module(where.partition(":")[0])
    except Exception as error:  # the ranks will meet it too, cold, and report it
        return f"preloading failed: {type(error).__name__}: {error}"
    return _threads()


def preloaded_modules(env: Mapping[str, str]) -> list[str]:
    """What a server started with `env` imports before it forks: MLflow only where its ranks track."""
    from abtune.tracking.uri import URI_VARIABLE

    uri = env.get(URI_VARIABLE)
    if not uri:
        return list(PRELOAD)
    from mlflow.store.db.db_types import DATABASE_ENGINES  # the schemes MLflow opens with SQLAlchemy

    database = uri.partition("://")[0].partition("+")[0] in DATABASE_ENGINES
    return [*PRELOAD, *TRACKING_PRELOAD, *(DATABASE_STORE_PRELOAD if database else ())]


def _threads() -> str | None:
    """A fork keeps only the forking thread: another thread's locks would stay held in the child."""
    count = psutil.Process().num_threads()
    return f"the server runs {count} threads" if count > 1 else None


def _private_folder(folder: Path) -> bool:
    info = folder.stat()
    return info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077 == 0


def serve(path: Path, owner: int) -> NoReturn:
    """Serve until stopped, then end without finalizing the interpreter: with torch, torchvision and MLflow
    imported, Python's finalization took seconds of CPU (6 s under load) that its owner waits for; every rank
    has ended by then and the server has removed its files."""
    if not _private_folder(path.parent):
        raise SystemExit(f"abtune warm server: {path.parent} is not a private folder of this user")
    with contextlib.suppress(ProcessLookupError):  # the owner ended before the server started
        Server(path, owner).serve()
    exit_without_finalizing(0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and len(sys.argv) == 4:
        serve(Path(sys.argv[2]), int(sys.argv[3]))
