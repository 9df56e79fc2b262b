"""`pip install .` outside the checkout: the shipped launcher profiles (top-level launchers/) and cluster
descriptions (clusters/) come along.

The venv is fresh and holds only abtune (installed without dependencies, from a copy of the files a
source distribution has); its dependencies come from the test's own venv through a .pth line, so
nothing is downloaded and the install takes seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import write_config

REPO = Path(__file__).resolve().parent.parent
SOURCE_FILES = ("pyproject.toml", "setup.py", "README.md", "abtune", "launchers", "clusters")
INSTALL_TIMEOUT_S = 300


def _copy_source(target: Path) -> Path:
    """The files an sdist holds, so the build writes its build/ and egg-info there, not in the checkout."""
    target.mkdir()
    for name in SOURCE_FILES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target / name)
    return target


def _fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # the dependencies (and setuptools to build with) from this venv; its .pth files are not run from here
    Path(purelib, "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


@pytest.mark.slow
def test_installed_abtune_finds_the_shipped_profiles_from_any_folder(tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path / "venv")
    source = _copy_source(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", str(source)], check=True, timeout=INSTALL_TIMEOUT_S)
    shutil.rmtree(source)  # nothing may still point into the source tree
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("SLURM")}
    env["PATH"] = str(python.parent)  # the venv's abtune; no sbatch

    where = subprocess.run([str(python), "-c", "import abtune; print(abtune.__file__)"], cwd=work, env=env,
                           check=True, capture_output=True, text=True).stdout.strip()
    assert Path(where).is_relative_to(tmp_path / "venv")

    config = write_config(work / "run.yaml", method={"name": "ab"})
    result = subprocess.run(["abtune", "train", str(config), "--launcher", "slurm", "--dry-run"], cwd=work,
                            env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=1" in result.stdout.splitlines()  # the shipped slurm.yaml's layout
    assert f"#SBATCH --chdir={work}" in result.stdout.splitlines()
    (work / "launchers").mkdir()  # a profile of the user's own, same name: it wins over the shipped one
    (work / "launchers" / "slurm.yaml").write_text("kind: slurm\npartition: mine\ntasks_per_node: 2\n")
    own = subprocess.run(["abtune", "train", str(config), "--launcher", "slurm", "--dry-run"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert own.returncode == 0, own.stderr
    assert "#SBATCH --partition=mine" in own.stdout.splitlines()

    unknown = subprocess.run(["abtune", "train", str(config), "--launcher", "nosuch"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert unknown.returncode == 2
    offered = unknown.stderr.split("choose one of ", 1)[1].split(" or ", 1)[0].split(", ")
    assert set(offered) == {p.stem for p in (REPO / "launchers").glob("*.yaml")}  # each file of launchers/ installed
    clusters = subprocess.run([str(python), "-c", "from abtune.timing import cluster_names; print(*cluster_names())"],
                              cwd=work, env=env, check=True, capture_output=True, text=True).stdout.split()
    assert set(clusters) == {p.stem for p in (REPO / "clusters").glob("*.yaml")}  # and each of clusters/


def test_the_shipped_profiles_have_one_home() -> None:
    from abtune.launch.profiles import BUILTIN_DIR, profile_names

    assert BUILTIN_DIR == REPO / "launchers"
    assert not (REPO / "abtune" / "launchers").exists()
    assert {p.stem for p in BUILTIN_DIR.glob("*.yaml")} <= set(profile_names())
    assert {"local", "debug", "slurm", "horeka_example"} <= set(profile_names())
