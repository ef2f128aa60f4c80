import os
import sys

import pytest

# The record/replay fixture, re-exported here the way a user's conftest does (TEST-30).
from composeai.testing import cassette  # noqa: F401

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch):
    """Every test gets its own state directory and clean name registries."""
    from composeai import _engine
    from composeai.flow import reset_registries

    monkeypatch.setenv("COMPOSE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("COMPOSE_TRACE_CONTENT", raising=False)
    _engine.reset_store()
    reset_registries()
    yield tmp_path / "state"
    _engine.reset_store()
    reset_registries()
