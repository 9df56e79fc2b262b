"""No password from a mistyped URL reaches output: the messages that quote a URL back are the ones saying it
could not be read, so `redact` masks credentials whatever shape the URL has, and the commands refuse such a
URL in one line that says what is wrong with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from abtune.cli import main
from abtune.redact import redact, redacting_excepthook
from tests.conftest import REPO

SECRET = "s3cretPW"
AT_SECRET = "s3cr@t3PW"  # an unencoded '@': its tail would otherwise be taken for the host
MALFORMED = (
    f"postgresql:/abtune:{SECRET}@127.0.0.1/db",
    f"postgresql//abtune:{SECRET}@127.0.0.1/db",
    f"postgresql:abtune:{SECRET}@127.0.0.1/db",
    f"abtune:{SECRET}@127.0.0.1/db",
    f"postgresql://abtune:{AT_SECRET}@127.0.0.1/db",
)


def _leaks(text: str) -> list[str]:
    return [part for part in (SECRET, *AT_SECRET.split("@")) if part in text]


@pytest.mark.parametrize("text", [
    *MALFORMED,
    f"https//user:{SECRET}@host:5000",
    f"postgresql://abtune:s3c/{SECRET}@127.0.0.1/db",
    f"storage 'postgresql:/abtune:{SECRET}@127.0.0.1/db' is unreachable",
    f"--storage=postgresql://abtune:{SECRET}@db/x",
    f"host=db password={SECRET} user=abtune",
    f"MLFLOW_TRACKING_PASSWORD={SECRET}",
])
def test_redact_masks_credentials_of_any_shape(text: str) -> None:
    shown = redact(text)
    assert not _leaks(shown), shown
    assert "***" in shown


@pytest.mark.parametrize("text", ["me@example.com", "sqlite:////tmp/optuna.db", "postgresql://abtune@db/x",
                                  "step 3: loss 0.5", "git@github.com:org/repo.git"])
def test_redact_leaves_text_without_secrets_alone(text: str) -> None:
    assert redact(text) == text


def _one_error_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert not _leaks(out + err), out + err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("abtune: error: "), err
    return lines[0]


@pytest.mark.parametrize("url", MALFORMED)
@pytest.mark.parametrize("command", [
    ["study", "status", "quickstart"],
    ["study", "create", str(REPO / "studies" / "quickstart.yaml")],
    ["study", "run", "quickstart"],
    ["ui"],
])
def test_a_malformed_storage_url_is_refused_without_its_password(command: list[str], url: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # `ui` would look for the tests' MLflow store
    line = _one_error_line(capsys, main([*command, "--storage", url]))
    assert ("unencoded '@'" in line) if AT_SECRET in url else ("is not a URL" in line), line
    assert not list(tmp_path.iterdir())  # nothing created under a name holding the password


def test_a_malformed_tracking_uri_is_refused_without_its_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["train", str(REPO / "studies" / "run_quickstart.yaml"), "--nproc", "2",
                 "--tracking-uri", f"https//user:{SECRET}@host:5000"])
    assert "tracking URI https//user:***@host:5000 is not a URL" in _one_error_line(capsys, code)
    assert not list(tmp_path.iterdir())


def test_a_storage_path_without_a_scheme_names_the_shapes_a_storage_takes(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    line = _one_error_line(capsys, main(["study", "status", "quickstart", "--storage", "optuna.db"]))
    assert "is not a storage URL: write sqlite:///FILE" in line


def test_an_unexpected_traceback_is_shown_with_credentials_masked(capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    main(["config", "show"])
    assert sys.excepthook is redacting_excepthook
    try:
        raise RuntimeError(f"could not use postgresql:/abtune:{SECRET}@127.0.0.1/db")
    except RuntimeError as error:
        sys.excepthook(RuntimeError, error, error.__traceback__)
    err = capsys.readouterr().err
    assert "RuntimeError: could not use postgresql:/abtune:***@127.0.0.1/db" in err and not _leaks(err)
