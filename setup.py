"""Everything else is in pyproject.toml. Package discovery cannot see abtune.launchers: it is the top-level
launchers/ folder (package-dir in pyproject.toml), so it is added to what discovery finds."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["abtune", "abtune.*"]), "abtune.launchers"])
