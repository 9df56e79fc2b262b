"""abtune on the torch it runs beside: every torch name its code reaches exists in the installed release.

pyproject admits a range of torch releases; CI installs one. A name only a newer release has (torch 2.13's
`dist.all_gather_single`, DDP's `forward_sync_buffers`) passes there and stops every run on an older torch
at its first use, on the GPU. This test reads abtune's code (and the benchmark scripts that run on GPU
images) with `ast` and looks up, in the torch that runs it, every attribute chain that starts at torch or
torchvision and every keyword argument handed to a torch callable: the suite run under another release
(docs/gpu.md, "Which torch releases were run") names every missing API at once. The aliases for older
releases look names up on purpose (getattr, a signature check), so they are not chains and do not count.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SCANNED = [REPO / "abtune", REPO / "benchmarks"]
ROOTS = ("torch", "torchvision")
MISSING = object()


@functools.cache
def _lookup(dotted: str) -> Any:
    """The object `dotted` names in the installed release (importing submodules on the way), or MISSING."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            try:
                found = getattr(found, name) if hasattr(found, name) else importlib.import_module(
                    f"{found.__name__}.{name}")
            except (ImportError, AttributeError):
                return MISSING
        return found
    return MISSING


def _torch_aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted torch name it stands for (`dist` -> `torch.distributed`)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in ROOTS:
                    aliases[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ROOTS:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _chain(node: ast.AST, aliases: dict[str, str]) -> str | None:
    attributes = []
    while isinstance(node, ast.Attribute):
        attributes.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id], *reversed(attributes)])
    return None


def _unknown_keywords(call: ast.Call, target: Any) -> Iterator[str]:
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    yield from (k.arg for k in call.keywords if k.arg is not None and k.arg not in parameters)


def missing_torch_apis(source: str, where: str) -> list[str]:
    """`where:LINE: NAME` for each torch name `source` reaches that the installed release lacks, and
    `where:LINE: CALLABLE(KEYWORD=...)` for each keyword argument a torch callable there does not take."""
    tree = ast.parse(source)
    aliases = _torch_aliases(tree)
    problems = [f"{where}:{node.lineno}: {name}" for node, name in (
        (n, _chain(n, aliases)) for n in ast.walk(tree) if isinstance(n, (ast.Attribute, ast.Name))
    ) if name is not None and _lookup(name) is MISSING]
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.keywords):
        name = _chain(call.func, aliases)
        target = MISSING if name is None else _lookup(name)
        if callable(target):
            problems += [f"{where}:{call.lineno}: {name}({k}=...)" for k in _unknown_keywords(call, target)]
    return problems


def test_every_torch_name_and_keyword_abtune_uses_exists_in_the_installed_torch() -> None:
    import torch

    problems = [problem for folder in SCANNED for path in sorted(folder.rglob("*.py"))
                for problem in missing_torch_apis(path.read_text(), str(path.relative_to(REPO)))]
    assert not problems, f"missing in torch {torch.__version__}:\n" + "\n".join(problems)


def test_a_name_or_keyword_the_installed_torch_lacks_is_reported_with_its_line() -> None:
    pytest.importorskip("torch")
    source = (
        "import torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel\n"
        "dist.all_gather_into_tensor(out, mine)\n"
        "dist.no_such_collective(out, mine)\n"
        "DistributedDataParallel(model, process_group=None, no_such_argument=False)\n"
    )
    assert missing_torch_apis(source, "x.py") == [
        "x.py:4: torch.distributed.no_such_collective",
        "x.py:5: torch.nn.parallel.DistributedDataParallel(no_such_argument=...)",
    ]


def _rank_keeps_its_buffer(rank: int, world_size: int, folder: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from abtune.exiting import exit_without_finalizing
    from abtune.methods.ddp.method import NO_FORWARD_BUFFER_SYNC

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world_size)
    try:
        model = nn.Linear(2, 1)
        model.register_buffer("marker", torch.full((1,), float(rank)))
        ddp = DistributedDataParallel(model, init_sync=False, **NO_FORWARD_BUFFER_SYNC)
        ddp(torch.ones(1, 2)).sum().backward()
        Path(folder, f"rank{rank}").write_text(str(model.marker.item()))
        dist.barrier()  # as a rank of abtune's ends (worker.finish_together)
    finally:
        dist.destroy_process_group()
    # ... and without finalizing, as abtune's ranks end (training/worker.py says why): DDP keeps its group alive until
    # the process ends, and a gloo thread that wants the GIL once finalization began aborts the rank ("terminate called
    # without an active exception": rank 1 of this test, now and then, under load)
    exit_without_finalizing(0)


@pytest.mark.slow
def test_ddp_leaves_each_ranks_buffers_alone_in_forward_under_this_release(tmp_path: Path) -> None:
    """abtune averages buffers itself (before evaluation, at AB's syncs); DDP must not broadcast rank 0's
    at each forward. torch 2.13 and newer say so with `forward_sync_buffers=False`, older releases with
    `broadcast_buffers=False`: whichever this release takes, rank 1 keeps its own buffer."""
    torch_multiprocessing = pytest.importorskip("torch.multiprocessing")
    torch_multiprocessing.spawn(_rank_keeps_its_buffer, args=(2, str(tmp_path)), nprocs=2)
    assert [float((tmp_path / f"rank{rank}").read_text()) for rank in (0, 1)] == [0.0, 1.0]
