"""YAML files given by name or path: `--launcher NAME|PATH` (launchers/), `--cluster NAME|PATH` (clusters/).

A name is looked up as `./FOLDER/NAME.yaml` (a project's own files) and then among the shipped ones: the
checkout's top-level FOLDER/, installed as the package data `abtune/FOLDER/` (pyproject.toml), so a name
works from any folder. Anything that looks like a path is taken as one. Adding a shipped file is adding it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class NamedFiles:
    """The YAML files of one kind: a project's `./FOLDER/`, then the shipped FOLDER."""

    folder: str

    @property
    def shipped(self) -> Path:
        """Installed from a wheel, the files sit inside the package; in a checkout (an editable install or
        PYTHONPATH), they are the top-level folder beside abtune/."""
        installed = _PACKAGE_DIR / self.folder
        return installed if installed.is_dir() else _PACKAGE_DIR.parent / self.folder

    @property
    def folders(self) -> tuple[Path, Path]:
        return Path(self.folder), self.shipped

    def find(self, name_or_path: str) -> Path | None:
        """A path if it looks like one (a .yaml/.yml suffix, a slash, or an existing file), else FOLDER/NAME.yaml
        in the first folder that has it (the project's before the shipped one); None: no such name."""
        given = Path(name_or_path)
        if given.suffix in (".yaml", ".yml") or given.exists() or "/" in name_or_path:
            return given
        return next((folder / f"{name_or_path}.yaml" for folder in self.folders
                     if (folder / f"{name_or_path}.yaml").is_file()), None)

    def names(self) -> list[str]:
        return sorted({p.stem for folder in self.folders if folder.is_dir() for p in folder.glob("*.yaml")})
