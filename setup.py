"""Everything else is in pyproject.toml. Package discovery cannot see abtune.launchers and abtune.clusters: they are the
top-level launchers/ and clusters/ folders (package-dir in pyproject.toml), so it is added to what discovery finds."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["abtune", "abtune.*"]), "abtune.launchers", "abtune.clusters"])
