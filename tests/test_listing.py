"""OPS-20 `compose.list_runs`: the filters and paging of `compose runs`,
checked against `compose runs --json`, and its `RunInfo` rows."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta, timezone

import pytest

import composeai as compose
from composeai import cli, flow, task
from composeai.errors import ConfigError


@task
def inc(x: int) -> int:
    return x + 1


@flow
def alpha(x: int) -> int:
    return inc(x)


@flow
def beta(x: int) -> int:
    compose.approve("ok")
    return x


@flow
def gamma(x: int) -> int:
    raise ValueError(f"boom {x}")


@pytest.fixture
def runs(store_kind):
    made = [alpha.run(i).id for i in range(5)]
    made += [beta.run(i).id for i in range(2)]
    for i in range(2):
        with pytest.raises(ValueError):
            gamma.run(i)
    return made + [r.id for r in compose.list_runs(name="gamma")]


def cli_ids(capsys, *args: str) -> list[str]:
    capsys.readouterr()
    assert cli.main(["runs", "--json", "-n", "100", *args]) == 0
    return [r["run_id"] for r in json.loads(capsys.readouterr().out)]


def ids(infos) -> list[str]:
    return [i.id for i in infos]


def test_ops20_list_runs_matches_compose_runs_json(runs, capsys):
    everything = compose.list_runs()
    assert ids(everything) == cli_ids(capsys)
    assert sorted(ids(everything)) == sorted(runs)
    for status in ("completed", "paused", "failed"):
        assert ids(compose.list_runs(status=status)) == cli_ids(capsys, "--status", status)
    assert ids(compose.list_runs(kind="flow")) == cli_ids(capsys, "--kind", "flow")
    assert ids(compose.list_runs(since="1d")) == cli_ids(capsys, "--since", "1d")
    both = compose.list_runs(status=["paused", "failed"])
    assert sorted(ids(both)) == sorted(
        cli_ids(capsys, "--status", "paused") + cli_ids(capsys, "--status", "failed")
    )
    assert [i.name for i in compose.list_runs(name="alpha")] == ["alpha"] * 5


def test_ops20_keyset_pages_cover_every_run_once(runs):
    pages: list[list[str]] = []
    before = None
    while True:
        page = compose.list_runs(limit=4, before=before)
        if not page:
            break
        pages.append(ids(page))
        before = page[-1].id
    assert [len(p) for p in pages] == [4, 4, 1]
    assert [i for p in pages for i in p] == ids(compose.list_runs())


def test_ops20_run_info_fields(runs):
    now = datetime.now(timezone.utc)
    paused = compose.list_runs(name="beta")[0]
    assert paused.status == "paused" and paused.pending == ["ok"]
    assert paused.kind == "flow" and paused.queue is None and paused.parent_id is None
    assert paused.created_at <= paused.updated_at <= now + timedelta(seconds=5)
    failed = compose.list_runs(name="gamma")[0]
    assert (failed.error_type, failed.error_message) == ("ValueError", "boom 1")
    done = compose.list_runs(name="alpha", limit=1)[0]
    assert done.pending == [] and done.error_type is None
    assert (done.input_tokens, done.output_tokens, done.cost_usd) == (0, 0, None)
    assert done.fingerprint
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.status = "x"  # type: ignore[misc]
    assert compose.list_runs(until=timedelta(hours=1)) == []
    assert len(compose.list_runs(since=now - timedelta(hours=1), until=now + timedelta(1))) == 9


def test_ops20_bad_arguments_are_config_errors(store_kind):
    with pytest.raises(ConfigError, match="no-such"):
        compose.list_runs(before="no-such")
    for bad in (0, -1, True, "3"):
        with pytest.raises(ConfigError, match="limit"):
            compose.list_runs(limit=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="bogus"):
        compose.list_runs(status="bogus")
    with pytest.raises(ConfigError, match="since"):
        compose.list_runs(since="yesterday")
    assert compose.list_runs() == []
