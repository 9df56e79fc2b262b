"""A launcher whose abtune comes from another checkout than the warm server's (an editable install that
points elsewhere) starts its ranks cold: the two would speak two versions of the handshake, and a rank
forked from the server would run the server's code, not the launcher's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from abtune.launch import warm


@pytest.mark.slow  # starts the session's warm server when no test before it has
def test_a_launcher_from_another_checkout_is_refused_and_starts_cold(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if not warm.enabled() or not os.environ.get(warm.SOCKET_VARIABLE):
        pytest.skip("no warm server in this session (ABTUNE_WARM_START=0)")
    monkeypatch.setattr(warm, "package_folder", lambda: str(tmp_path / "other-checkout" / "abtune" / "launch"))
    assert warm.spawn([str(tmp_path / "never-runs")], dict(os.environ)) is None
    log = Path(os.environ[warm.SOCKET_VARIABLE]).parent / warm.LOG_FILE
    assert "abtune from another checkout" in log.read_text()
    assert not (tmp_path / "never-runs").exists()


CHECKOUT = str(Path(warm.__file__).parents[2])


def _base_path() -> list[str]:
    return [entry for entry in sys.path if os.path.abspath(entry) != CHECKOUT]


def test_a_launcher_elsewhere_whose_ranks_import_the_same_abtune_is_taken(tmp_path: Path) -> None:
    """The server started in the checkout (its abtune from there); a launcher working in another folder,
    without PYTHONPATH, gets the same abtune from the editable install's finder: no reason to start cold."""
    assert warm._path_mismatch([str(tmp_path)], [CHECKOUT], _base_path(), {"abtune": CHECKOUT}) is None


def test_a_launcher_whose_ranks_would_import_another_abtune_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other"
    (other / "abtune").mkdir(parents=True)
    (other / "abtune" / "__init__.py").write_text("")
    refusal = warm._path_mismatch([str(tmp_path)], [CHECKOUT], [str(other), *_base_path()], {"abtune": CHECKOUT})
    assert refusal == f"abtune would not come from {CHECKOUT}"
