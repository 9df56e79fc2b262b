"""Loads fixture.py as a plugin (not a star import: a test module elsewhere that also asks for
`pytest_plugins = ["tests.postgres.fixture"]` then shares the same session server, not a second one)."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.import_plugin("tests.postgres.fixture")
