"""Fresh-process start-up: what `import composeai` and a resume load (PKG-5, issue 13),
the written-out dataclasses against `@dataclass` (AGENT-55, AGENT-80, BUDGET-1, OBS-10),
and FLOW-9 fingerprints taken from a source snapshot."""

from __future__ import annotations

import dataclasses
import inspect
import os
import pickle
import random
import subprocess
import sys
import textwrap
import time
from typing import Any, Generic, Literal, TypeVar

import pytest

import composeai
from composeai import _source
from composeai.events import Event, EventKind
from composeai.flow import _fingerprint
from composeai.runs import Budget, Run, _LazyUsage
from composeai.tracing import ErrorInfo, Span, _new_span_id

HEAVY = (
    "dataclasses",
    "inspect",
    "ast",
    "tokenize",
    "typing",
    "re",
    "json",
    "enum",
    "pydantic",
    "asyncio",
    # `threading` and `functools` import `collections` and more: together
    # several milliseconds of a fresh process (issue 13's resume).
    "threading",
    "functools",
    "collections",
    "contextvars",
    "types",
)


def _child_env(tmp_path) -> dict[str, str]:
    env = dict(os.environ)
    env["COMPOSE_DIR"] = str(tmp_path / "state")
    env.pop("COMPOSE_STORE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH", "")) if p)
    return env


def test_pkg5_import_composeai_loads_no_heavy_module():
    code = (
        "import sys, composeai\n"
        f"loaded = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("name", ["MapResult", "aggregate", "amap", "map", "pipe"])
def test_pkg4_lazy_combinator_names(name):
    """The combinators load on first access and stay listed and importable."""
    code = (
        "import sys, composeai\n"
        "assert 'composeai.combinators' not in sys.modules\n"
        f"assert {name!r} in dir(composeai) and {name!r} in composeai.__all__\n"
        f"from composeai import {name}\n"
        "from composeai import combinators\n"
        f"assert {name} is getattr(combinators, {name!r})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_pkg4_every_public_name_resolves():
    for name in composeai.__all__:
        assert getattr(composeai, name) is not None, name
    assert set(composeai.__all__) <= set(dir(composeai))


def test_flow41_resume_in_a_fresh_process_loads_no_heavy_module(tmp_path):
    """A fresh process resuming a paused run checks the fingerprint and replays without
    `inspect`, `dataclasses` or pydantic."""
    (tmp_path / "startup_flow.py").write_text(
        textwrap.dedent(
            """\
            import composeai as compose


            @compose.task
            def inc(x):
                return x + 1


            @compose.flow
            def gated(n):
                x = 0
                for _ in range(n):
                    x = inc(x)
                # a comment at the body's indentation belongs to the source
                if compose.approve("go"):
                    return x
                return -1
            # a comment at the left margin does not
            """
        )
    )
    env = _child_env(tmp_path)
    start = "import startup_flow; print(startup_flow.gated.run(5).id)"
    run_id = subprocess.run(
        [sys.executable, "-c", start], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
    resume = (
        "import sys, composeai, startup_flow\n"
        f"run = composeai.resume({run_id!r}, answers={{'go': True}})\n"
        "assert run.status == 'completed' and run.output == 5, run\n"
        f"loaded = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", resume], env=env, check=True, timeout=60)


def test_flow41_changed_source_still_raises_in_a_fresh_process(tmp_path):
    src = tmp_path / "startup_changed.py"
    body = (
        "import composeai as compose\n\n\n"
        "@compose.flow\n"
        "def gated():\n"
        "    return compose.approve('go')\n"
    )
    src.write_text(body)
    env = _child_env(tmp_path)
    start = "import startup_changed; print(startup_changed.gated.run().id)"
    run_id = subprocess.run(
        [sys.executable, "-c", start], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
    # Appending to the body keeps the old text as a prefix: still a mismatch.
    src.write_text(body + "    return 1\n")
    resume = (
        "import composeai, startup_changed\n"
        "from composeai.errors import ResumeMismatchError\n"
        "try:\n"
        f"    composeai.resume({run_id!r}, answers={{'go': True}})\n"
        "except ResumeMismatchError:\n"
        "    print('mismatch')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", resume], env=env, check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "mismatch"


# --------------------------------------------------------------------------- FLOW-9 snapshot

LAYOUTS = {
    "plain": "def f(x):\n    return x\n",
    "decorated": "@decorator\ndef f(x):\n    return x\n\n\nx = 1\n",
    "decorator_args": "@decorator(\n    name='n',\n)\ndef f(x):\n    return x\n",
    "signature": "def f(\n    a,\n    b,\n) -> int:\n    return a\n",
    "trailing_comment_body": "def f():\n    return 1\n    # kept\n\n# dropped\ny = 2\n",
    "comment_between": "def f():\n    x = 1\n# margin\n    return x\n",
    "string_at_margin": 'def f():\n    s = """\ntext\ndef g():\n"""\n    return s\n',
    "nested": "def f():\n    def g():\n        return 1\n\n    return g\n\n\ndef h():\n    pass\n",
    "one_liner": "def f(): return 1\ndef g(): return 2\n",
    "async": "async def f():\n    return 1\n",
    "method": "class C:\n    def f(self):\n        return 1\n\n    def g(self):\n        return 2\n",
    "tabs": "class C:\n\tdef f(self):\n\t\treturn 1\n",
    "crlf": "def f():\r\n    return 1\r\n",
    "no_final_newline": "def f():\n    return 1",
    "continued": "def f():\n    return (1 +\n2)\n",
}


def _load(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    module.decorator = lambda *a, **k: (lambda fn: fn) if not a else a[0]
    spec.loader.exec_module(module)
    return vars(module)


def _functions(path):
    ns = _load(path)
    fns = [v for v in ns.values() if inspect.isfunction(v) and v.__code__.co_filename == str(path)]
    for cls in [v for v in ns.values() if inspect.isclass(v)]:
        fns += [v for v in vars(cls).values() if inspect.isfunction(v)]
    return fns


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_flow9_snapshot_fingerprint_is_inspects(tmp_path, layout):
    path = tmp_path / f"layout_{layout}.py"
    path.write_bytes(LAYOUTS[layout].encode())
    fns = _functions(path)
    assert fns
    for fn in fns:
        expected = _fingerprint(fn)  # inspect.getsource + textwrap.dedent
        snap = _source.snapshot(fn)
        if snap is None:
            continue
        assert snap.fingerprint() == expected, fn
        # `matches` may decline (False) but never confirms a wrong fingerprint.
        assert not snap.matches(_fingerprint(_flow9_other))
        # Tabs, or a `def` inside a string at the margin: left to `inspect`.
        if layout not in ("tabs", "string_at_margin"):
            assert snap.matches(expected), fn


def _flow9_other():
    return None


def test_flow9_snapshot_declines_what_only_inspect_reads(tmp_path):
    cookie = tmp_path / "latin.py"
    cookie.write_bytes(b"# -*- coding: latin-1 -*-\ndef f():\n    return '\xe9'\n")
    assert _source.snapshot(_load(cookie)["f"]) is None
    assert _source.snapshot(len) is None
    assert _source.snapshot(lambda: 0) is None


def test_flow9_dedent_is_textwraps():
    rnd = random.Random(13)
    samples = ["  a\n  b\n", "\ta\n\t\tb\n  \n", "  a\n\tb\n", " \n  a\n   \n", "", "a"]
    for _ in range(2000):
        samples.append("".join(rnd.choice(" \t\na#") for _ in range(rnd.randint(0, 24))))
    for s in samples:
        assert _source.dedent(s) == textwrap.dedent(s), repr(s)


# --------------------------------------------------------------------------- dataclasses


R = TypeVar("R")


@dataclasses.dataclass
class RefRun(Generic[R]):
    id: str
    status: Literal["completed", "paused", "failed", "cancelled"]
    output: R
    usage: Any = _LazyUsage()  # noqa: RUF009 -- Run's own default
    trace: Any = None
    messages: list[Any] = dataclasses.field(default_factory=list)
    pending: Any = None


@dataclasses.dataclass
class RefBudget:
    usd: float | None = None
    tokens: int | None = None


@dataclasses.dataclass(slots=True)
class RefErrorInfo:
    type: str
    message: str
    stacktrace: str = ""


@dataclasses.dataclass(kw_only=True, slots=True)
class RefSpan:
    trace_id: str
    span_id: str = dataclasses.field(default_factory=_new_span_id)
    parent_span_id: str | None = None
    kind: str
    name: str
    started_at: float = dataclasses.field(default_factory=time.time)
    ended_at: float | None = None
    status: str = "running"
    error: ErrorInfo | None = None
    input: Any = None
    output: Any = None
    usage: Any = None
    attributes: dict[str, Any] = dataclasses.field(default_factory=dict)
    replayed: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class RefEvent:
    kind: EventKind
    ts: float = dataclasses.field(default_factory=time.time)
    trace_id: str | None = None
    span_id: str | None = None
    name: str | None = None
    text: str | None = None
    data: dict[str, Any] | None = None


PAIRS = [
    (Run, RefRun, {"id": "r", "status": "completed", "output": [1]}),
    (Budget, RefBudget, {"usd": 1.5}),
    (ErrorInfo, RefErrorInfo, {"type": "ValueError", "message": "m"}),
    (
        Span,
        RefSpan,
        {"trace_id": "t", "span_id": "s", "kind": "task", "name": "n", "started_at": 1.0},
    ),
    (Event, RefEvent, {"kind": "text_delta", "ts": 2.0, "text": "x"}),
]


def _default(value):
    return type(value).__name__ if isinstance(value, _LazyUsage) else value


def _field_shape(cls):
    return [
        (
            f.name,
            _default(f.default) if f.default is not dataclasses.MISSING else "<missing>",
            f.default_factory if f.default_factory is not dataclasses.MISSING else "<missing>",
            f.init,
            f.repr,
            f.compare,
            f.hash,
            f.kw_only,
        )
        for f in dataclasses.fields(cls)
    ]


def _signature(cls):
    return [
        (p.name, p.kind, repr(_default(p.default)))
        for p in inspect.signature(cls).parameters.values()
    ]


@pytest.mark.parametrize("cls,ref,kwargs", PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_written_out_dataclass_matches_decorated(cls, ref, kwargs):
    """AGENT-55, BUDGET-1, OBS-10, AGENT-80: each is a dataclass with `@dataclass`'s
    fields, parameters, init, repr, equality, hashing, slots, match args and pickling."""
    assert dataclasses.is_dataclass(cls)
    assert _field_shape(cls) == _field_shape(ref)
    assert repr(cls.__dataclass_params__) == repr(ref.__dataclass_params__)
    assert [f.type for f in dataclasses.fields(cls)] == [f.type for f in dataclasses.fields(ref)]
    assert _signature(cls) == _signature(ref)
    assert cls.__match_args__ == ref.__match_args__
    assert getattr(cls, "__slots__", None) == getattr(ref, "__slots__", None)
    assert (cls.__hash__ is None) == (ref.__hash__ is None)
    a, b = cls(**kwargs), ref(**kwargs)
    assert repr(a).replace(cls.__qualname__, "X", 1) == repr(b).replace(ref.__qualname__, "X", 1)
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert a == cls(**kwargs)
    assert not a.__ne__(cls(**kwargs))
    assert a != b  # another class: NotImplemented both ways, then identity
    assert pickle.loads(pickle.dumps(a)) == a
    if ref.__hash__ is not None:
        assert hash(a) == hash(cls(**kwargs)) == hash(b)
    changed = dataclasses.replace(a, **{dataclasses.fields(cls)[-1].name: "changed"})
    assert changed != a and type(changed) is cls


def test_agent80_event_is_frozen():
    ev = Event("text_delta", text="x")
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'text'"):
        ev.text = "y"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'text'"):
        del ev.text  # type: ignore[misc]


def test_budget1_post_init_still_checks():
    from composeai.errors import ConfigError

    with pytest.raises(ConfigError):
        Budget()
    with pytest.raises(ConfigError):
        dataclasses.replace(Budget(usd=1.0), usd=None)


def test_agent55_run_usage_default_and_messages_factory():
    a = Run(id="a", status="completed", output=None)
    b = Run(id="b", status="completed", output=None)
    assert a.messages == [] and a.messages is not b.messages
    assert a.__dict__["_usage"] is None  # no Usage (pydantic) until asked for


def test_agent55_pydantic_and_type_hints_resolve_the_dataclasses():
    """Annotations imported only for type checkers are bound once the dataclass is
    looked at, so pydantic validates a `Run` and `get_type_hints` resolves it."""
    import typing

    import pydantic

    run = pydantic.TypeAdapter(Run[int]).validate_python(
        {"id": "x", "status": "completed", "output": 1}
    )
    assert run == Run(id="x", status="completed", output=1)
    for cls in (Run, Event, Span, Budget, ErrorInfo):
        assert dataclasses.is_dataclass(cls)
        hints = typing.get_type_hints(cls)
        assert list(hints) == [f.name for f in dataclasses.fields(cls)]
    assert typing.get_type_hints(Event)["kind"] == EventKind
