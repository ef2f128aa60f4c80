import itertools
import os
import sys

import pytest

# The record/replay fixture, re-exported here the way a user's conftest does (TEST-30).
from composeai.testing import cassette  # noqa: F401

sys.path.insert(0, os.path.dirname(__file__))

# Modules whose tests run on both stores (STORE-2): each test gets a fresh
# schema of one throwaway PostgreSQL cluster per session.
BOTH_STORES = {
    "test_flows",
    "test_resume",
    "test_composition",
    "test_agents",
    "test_stores",
    "test_map",
    "test_async",
    "test_budgets",
    "test_chats",
    "test_streams",
    "test_tools",
    "test_events",
    "test_queues",
    "test_durable_agentrun",
    "test_durable_await",
    "test_durable_cancel",
    "test_durable_failures",
    "test_durable_gather",
    "test_durable_retry",
    "test_durable_signals",
    "test_durable_sleep",
    "test_durable_store",
    "test_durable_worker",
    "test_graph_agents",
    "test_graph_build",
    "test_graph_example",
    "test_graph_process",
    "test_graph_run",
    "test_graph_threads",
    "test_cli",
    "test_crash",
    "test_cross_process",
    "test_agent_process",
    "test_async_process",
    "test_run_ids",
    "test_deadlines",
    "test_schedules",
    "test_deploys",
    "test_published",
    "test_listing",
    "test_retention",
}

_schemas = itertools.count()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "sqlite_file: the test reads the SQLite file itself, so it runs on SQLite only",
    )


def pytest_generate_tests(metafunc):
    module = metafunc.module.__name__.rpartition(".")[2]
    if module in BOTH_STORES and "store_kind" in metafunc.fixturenames:
        metafunc.parametrize("store_kind", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture
def store_kind(request):
    """The store a test runs on: `sqlite` unless parametrized."""
    return getattr(request, "param", "sqlite")


@pytest.fixture(scope="session")
def pg_cluster():
    """A PostgreSQL cluster for the session; skipped without PostgreSQL,
    except under CI where that is a failure."""
    import _pg

    bindir = _pg.find_bindir()
    if bindir is None:
        reason = (
            "PostgreSQL (initdb, pg_ctl) is not installed: "
            "apt-get install postgresql to run the PostgreSQL store tests"
        )
        if os.environ.get("CI"):
            pytest.fail(reason + " (required under CI)")
        pytest.skip(reason)
    cluster = _pg.Cluster(bindir).start()
    yield cluster
    cluster.stop()


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch, store_kind, request):
    """Every test gets its own state directory (and, on PostgreSQL, its own
    schema) and clean name registries."""
    from composeai import _engine, agentfn
    from composeai.flow import reset_registries

    monkeypatch.setenv("COMPOSE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("COMPOSE_TRACE_CONTENT", raising=False)
    monkeypatch.setattr(_engine, "_configured_store", None)
    if store_kind == "postgresql":
        if request.node.get_closest_marker("sqlite_file"):
            pytest.skip("inspects the SQLite file's tables directly")
        cluster = request.getfixturevalue("pg_cluster")
        monkeypatch.setenv("COMPOSE_STORE", cluster.url(f"t{os.getpid()}_{next(_schemas)}"))
    else:
        monkeypatch.delenv("COMPOSE_STORE", raising=False)
    _engine.reset_store()
    reset_registries()
    # Agents a test defines are forgotten with it, so the same test can run
    # again on the other store.
    agents = dict(agentfn._AGENTS)
    yield tmp_path / "state"
    _engine.reset_store()
    reset_registries()
    agentfn._AGENTS.clear()
    agentfn._AGENTS.update(agents)
