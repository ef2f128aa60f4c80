"""The static typing contract (COMP-40 … COMP-46, PKG-4), checked with mypy.

Pyright is normative, but it needs npm; mypy installs from PyPI (the `test` extra), so these
snippets pin what both checkers agree on. Each snippet is type-checked against the installed
package in one mypy run. In a snippet, a line ending in `# E` (or `# E: <error code>`) must be
reported as an error, a `reveal_type(...)  # R: <type>` line must reveal exactly that type
(module prefixes dropped), and every other line must type-check.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip(
    "mypy", reason="mypy is not installed (it is in the `test` extra: pip install '.[test]')"
)

SNIPPETS: dict[str, str] = {
    # COMP-40: @agent keeps the parameter list and the return type.
    "agents": '''
        from typing import Any

        from typing_extensions import assert_type

        from composeai import Budget, Run, agent
        from composeai.agentfn import AgentFunction
        from composeai.runs import AsyncRunStream, RunStream


        @agent
        def summarize(text: str) -> str:
            """Summarize."""
            return text


        @agent(model="test", max_turns=3)
        async def rate(text: str, scale: int = 5) -> float:
            """Rate."""
            return 0.0


        reveal_type(summarize)  # R: AgentFunction[[text: str], str]
        reveal_type(rate)  # R: AgentFunction[[text: str, scale: int =], float]
        assert_type(summarize("x"), str)
        assert_type(summarize(text="x"), str)
        assert_type(rate("x", 3), float)
        assert_type(summarize("x", budget=Budget(usd=1.0)), str)
        summarize(1)  # E: call-overload
        summarize("x", "y")  # E: call-overload
        rate("x", scale="high")  # E: call-overload
        assert_type(summarize.run("x"), Run[str])
        assert_type(summarize.run("x", budget=Budget(tokens=10), system="s").output, str)
        assert_type(rate.stream("x"), RunStream[float])
        assert_type(rate.astream("x"), AsyncRunStream[float])


        async def use() -> None:
            assert_type(await summarize.arun("x"), Run[str])
            assert_type(await rate.arun("x", 2), Run[float])


        def bare(fn: AgentFunction, run: Run, stream: RunStream, astream: AsyncRunStream) -> None:
            reveal_type(fn)  # R: AgentFunction[..., Any]
            reveal_type(run)  # R: Run[Any]
            reveal_type(stream)  # R: RunStream[Any]
            reveal_type(astream)  # R: AsyncRunStream[Any]
            assert_type(fn(1, 2, anything=3), Any)
    ''',
    # COMP-41, COMP-46: @task, @flow, @tool; `async def` bodies carry the awaited type.
    "flows": '''
        from typing import Any

        from typing_extensions import assert_type

        from composeai import Budget, Run, aresume, flow, resume, task
        from composeai.flow import Flow, Task
        from composeai.runs import RunStream
        from composeai.tools import Tool, tool


        @task
        async def fetch(url: str) -> bytes:
            return b""


        @task(retries=2, timeout=5.0)
        def parse(data: bytes) -> dict[str, int]:
            return {}


        @flow
        async def crawl(url: str, depth: int = 1) -> list[str]:
            return [str(parse(await fetch.arun(url)))]


        @flow(name="counted")
        def counted(n: int) -> int:
            return n


        @tool
        async def lookup(query: str) -> float:
            """Look something up."""
            return 1.0


        @tool(name="add", requires_approval=True)
        def add(a: int, b: int) -> int:
            """Add two numbers."""
            return a + b


        reveal_type(fetch)  # R: Task[[url: str], bytes]
        reveal_type(parse)  # R: Task[[data: bytes], dict[str, int]]
        reveal_type(crawl)  # R: Flow[[url: str, depth: int =], list[str]]
        reveal_type(counted)  # R: Flow[[n: int], int]
        reveal_type(lookup)  # R: Tool[[query: str], float]
        reveal_type(add)  # R: Tool[[a: int, b: int], int]
        assert_type(fetch("u"), bytes)
        assert_type(crawl("u", depth=2), list[str])
        assert_type(crawl("u", budget=Budget(usd=1.0)), list[str])
        assert_type(crawl.run("u"), Run[list[str]])
        assert_type(crawl.run("u").output, list[str])
        assert_type(counted.stream(1), RunStream[int])
        assert_type(add(1, 2), int)
        fetch(1)  # E: arg-type
        crawl(1)  # E: call-overload
        add(1)  # E: call-arg
        assert_type(resume("run-id"), Run[Any])


        async def use() -> None:
            assert_type(await fetch.arun("u"), bytes)
            assert_type(await crawl.arun("u"), Run[list[str]])
            assert_type(await aresume("run-id", {"k": True}), Run[Any])


        def bare(f: Flow, t: Task, tl: Tool) -> None:
            reveal_type(f)  # R: Flow[..., Any]
            reveal_type(t)  # R: Task[..., Any]
            reveal_type(tl)  # R: Tool[..., Any]
    ''',
    # COMP-42 … COMP-44: pipe(), `>>` and aggregate().
    "pipes": '''
        from typing import Any

        from typing_extensions import assert_type

        from composeai import agent, aggregate, pipe, task
        from composeai.combinators import Aggregate, Pipeline, Stage


        def to_text(n: int) -> str:
            return str(n)


        def to_len(s: str) -> int:
            return len(s)


        def to_float(n: int) -> float:
            return float(n)


        @agent
        def shout(text: str) -> str:
            """Shout."""
            return text


        @agent
        def pair(a: str, b: str) -> str:
            """Pair."""
            return a


        @task
        async def double(n: int) -> int:
            return 2 * n


        p2 = pipe(to_text, to_len)
        reveal_type(p2)  # R: Pipeline[int, int]
        p9 = pipe(to_text, to_len, to_text, shout, to_len, double, to_text, to_len, to_float)
        reveal_type(p9)  # R: Pipeline[int, float]
        pipe(to_text, to_len, to_text, to_len, to_text, to_len, to_text, to_len, to_text, to_len)  # E: call-overload
        pipe(to_text, to_float)  # E
        pipe(to_text, pair)  # E
        assert_type(p2(3), int)
        assert_type(p2.run(3).output, int)
        p2("x")  # E: arg-type
        reveal_type(shout >> to_len)  # R: Pipeline[str, int]
        reveal_type(to_text >> shout)  # R: Pipeline[int, str]
        reveal_type(shout >> to_len >> to_text)  # R: Pipeline[str, str]
        reveal_type(p2 >> to_float)  # R: Pipeline[int, float]
        reveal_type(to_len >> p2)  # R: Pipeline[str, int]
        pair >> to_len  # E
        shout >> to_float  # E
        stage: Stage[int, str] = to_text
        wrong: Stage[str, str] = to_text  # E: assignment
        agg: Aggregate[str] = aggregate(a=to_len, b=shout, timeout_per_branch=1.0)
        assert_type(agg("x"), dict[str, Any])
        assert_type(agg.run("x").output, dict[str, Any])
        reveal_type(agg >> len)  # R: Pipeline[str, int]
        agg >> to_text  # E


        def bare(p: Pipeline, a: Aggregate) -> None:
            reveal_type(p)  # R: Pipeline[Any, Any]
            reveal_type(a)  # R: Aggregate[Any]
            assert_type(a(1), dict[str, Any])
    ''',
    # COMP-45: map/amap, raise vs collect, async functions awaited.
    "maps": """
        from typing_extensions import assert_type

        from composeai import MapResult, amap, map, task


        def square(n: int) -> int:
            return n * n


        async def fetch(url: str) -> bytes:
            return b""


        @task
        async def afetch(url: str) -> bytes:
            return b""


        assert_type(map(square, [1, 2]), list[int])
        assert_type(map(square, (1, 2), on_error="raise"), list[int])
        assert_type(map(square, [1, 2], on_error="collect"), list[MapResult[int]])
        assert_type(map(fetch, ["u"]), list[bytes])
        assert_type(map(afetch, ["u"], on_error="collect", max_workers=4), list[MapResult[bytes]])
        map(square, ["x"])  # E
        map(square, [1], on_error="ignore")  # E: call-overload


        async def use() -> None:
            assert_type(await amap(fetch, ["u"]), list[bytes])
            assert_type(await amap(afetch, ["u"]), list[bytes])
            assert_type(await amap(square, [1], on_error="collect"), list[MapResult[int]])
            results = await amap(fetch, ("a", "b"), on_error="collect", timeout_per_item=1.0)
            assert_type(results[0].value, bytes | None)


        def bare(m: MapResult) -> None:
            reveal_type(m)  # R: MapResult[Any]
    """,
}

_LINE = re.compile(r"^snip_(\w+)\.py:(\d+): (error|note): (.*?)(?:  \[([\w-]+)\])?$")
_REVEALED = re.compile(r'^Revealed type is "(.*)"$')
_ERROR_MARK = re.compile(r"#\s*E(?::\s*([\w-]+))?\s*$")
_REVEAL_MARK = re.compile(r"#\s*R:\s*(.+?)\s*$")
_PREFIX = re.compile(r"\b(?:composeai|typing|builtins)\.(?:\w+\.)*")


def _source(name: str) -> str:
    return textwrap.dedent(SNIPPETS[name]).lstrip("\n")


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, list]]:
    """`{snippet: {line: [(kind, message, code), ...]}}` from one mypy run."""
    root: Path = tmp_path_factory.mktemp("typing")
    files = []
    for name in SNIPPETS:
        path = root / f"snip_{name}.py"
        path.write_text(_source(name))
        files.append(path.name)
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--no-incremental",
        "--python-version",
        "3.10",
        "--ignore-missing-imports",
        "--cache-dir",
        str(root / ".mypy_cache"),
        "--show-error-codes",
        "--no-error-summary",
        "--hide-error-context",
        "--no-pretty",
        "--no-color-output",
        *files,
    ]
    proc = subprocess.run(cmd, check=False, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), f"mypy failed to run:\n{proc.stdout}\n{proc.stderr}"
    report: dict[str, dict[int, list]] = {name: {} for name in SNIPPETS}
    for line in proc.stdout.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        name, lineno, kind, message, code = m.groups()
        report[name].setdefault(int(lineno), []).append((kind, message, code))
    return report


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_snippet_type_checks_as_marked(name: str, mypy_report: dict) -> None:
    lines = _source(name).splitlines()
    found = mypy_report[name]
    problems = []
    for lineno, text in enumerate(lines, 1):
        entries = found.get(lineno, [])
        errors = [(msg, code) for kind, msg, code in entries if kind == "error"]
        reveals = [
            _PREFIX.sub("", m.group(1))
            for kind, msg, _ in entries
            if kind == "note" and (m := _REVEALED.match(msg))
        ]
        error_mark = _ERROR_MARK.search(text)
        reveal_mark = _REVEAL_MARK.search(text)
        where = f"line {lineno}: {text.strip()}"
        if error_mark is None and errors:
            problems.append(f"{where}\n    unexpected error(s): {errors}")
        elif error_mark is not None and not errors:
            problems.append(f"{where}\n    expected an error, mypy accepted it")
        elif error_mark is not None and error_mark.group(1) not in {None, *(c for _, c in errors)}:
            problems.append(f"{where}\n    expected [{error_mark.group(1)}], got {errors}")
        if reveal_mark is not None and reveals != [reveal_mark.group(1)]:
            problems.append(f"{where}\n    revealed {reveals}")
    assert not problems, f"snippet {name!r}:\n" + "\n".join(problems)
