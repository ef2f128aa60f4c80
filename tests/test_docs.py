"""The documentation's code runs: every ```python block of docs/**/*.md and of
README.md is executed, each page's blocks in order in one namespace, in a
fresh directory with its own COMPOSE_DIR, offline, in a child process.

```py blocks are display-only (code that needs a server, a worker process or
an API key) and are not run. The API reference pages name every public
object, so a new public name cannot be left out of the docs.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import composeai

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """The ```python fenced blocks of a Markdown text, as `(first line, code)`;
    a block indented under a list item is dedented by its fence's indent."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence = m["indent"], m["fence"]
        language = m["info"].strip().split(" ")[0] if m["info"].strip() else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = _FENCE.match(lines[j])
            if (
                closing is not None
                and closing["fence"].startswith(fence[0])
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            line = lines[j]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            j += 1
        if language == "python":
            blocks.append((i + 2, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def pages() -> list[Path]:
    found = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]
    return [p for p in found if python_blocks(p.read_text(encoding="utf-8"))]


# Runs the blocks in `__main__`'s namespace, as a script would: each block is
# compiled from a file of its own (so `inspect.getsource`, which flows use to
# fingerprint their code, finds it) named after the page and line.
_RUNNER = """
import sys
__file__ = sys.argv[1]
for __block in sys.argv[2:]:
    with open(__block, encoding="utf-8") as __f:
        exec(compile(__f.read(), __block, "exec"))
"""


def _offline_env(tmp: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("COMPOSE_", "ANTHROPIC_", "OPENAI_", "OTEL_"))
    }
    env["COMPOSE_DIR"] = str(tmp / ".compose")
    # Anything that tries the network fails at once instead of reaching it.
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        env[proxy] = "http://127.0.0.1:9"
    env["NO_PROXY"] = env["no_proxy"] = ""
    env["PYTHONPATH"] = os.pathsep.join([str(tmp), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_of_the_page_run(page: Path, tmp_path: Path) -> None:
    """Every ```python block of the page runs, in order, in one namespace."""
    relative = page.relative_to(ROOT)
    files = []
    for line, code in python_blocks(page.read_text(encoding="utf-8")):
        stem = re.sub(r"\W", "_", str(relative.with_suffix("")))
        path = tmp_path / "_blocks" / f"{stem}_line{line}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(code, encoding="utf-8")
        files.append(str(path))
    result = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(page), *files],
        cwd=tmp_path,
        env=_offline_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, (
        f"{relative}: a python block failed (the file names give its first line)\n"
        f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    )


def test_the_collector_finds_blocks_and_skips_display_only_ones() -> None:
    """```python blocks are collected, dedented under list items; ```py,
    ```bash and unlabelled blocks are not."""
    text = (
        "# t\n\n```python\na = 1\n```\n\n```py\nnot_run()\n```\n\n"
        "- item\n\n    ```python\n    b = a + 1\n    ```\n\n```bash\nls\n```\n\n```\nx\n```\n"
    )
    assert python_blocks(text) == [(4, "a = 1\n"), (14, "b = a + 1\n")]


# -- the API reference ----------------------------------------------------------------------

# The public modules: what users import (the package and its submodules).
PUBLIC_MODULES = [
    "composeai",
    "composeai.agentfn",
    "composeai.chat",
    "composeai.cli",
    "composeai.combinators",
    "composeai.durable",
    "composeai.errors",
    "composeai.events",
    "composeai.flow",
    "composeai.graph",
    "composeai.hitl",
    "composeai.interception",
    "composeai.mcp",
    "composeai.messages",
    "composeai.models.anthropic",
    "composeai.models.base",
    "composeai.models.compatible",
    "composeai.models.openai",
    "composeai.models.prices",
    "composeai.models.registry",
    "composeai.queues",
    "composeai.runs",
    "composeai.testing",
    "composeai.tools",
    "composeai.tracing",
]

# Public names that are not Python objects mkdocstrings can render: the
# `cassette` pytest fixture is documented in prose under its own heading.
PROSE = {("composeai.testing", "cassette"): "### `cassette`"}

_DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.MULTILINE)


def _module(name: str):
    # `import_module` returns the module even where the package attribute of
    # the same name is a function (`composeai.flow` the decorator).
    return importlib.import_module(name)


def public_names() -> list[tuple[str, str]]:
    """`(module, name)` of every public name: each public module's `__all__`,
    plus the package's lazily loaded attributes."""
    found = []
    for module_name in PUBLIC_MODULES:
        module = _module(module_name)
        names = list(getattr(module, "__all__", ()))
        if module_name == "composeai":
            names += [n for n in composeai._LAZY if n not in names]
        found += [(module_name, n) for n in names]
    return found


def _resolve(path: str) -> object:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def _reference_source() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(REFERENCE.glob("*.md")))


def test_every_public_name_is_in_the_api_reference() -> None:
    """Each public name has a `::: path` directive in docs/reference/ whose
    object is that very object (or, for a fixture, a heading of its own)."""
    source = _reference_source()
    documented: set[int] = set()
    whole_modules: set[str] = set()
    for path in _DIRECTIVE.findall(source):
        obj = _resolve(path)
        documented.add(id(obj))
        if isinstance(obj, types.ModuleType):
            # A module's directive renders the names of its `__all__`.
            whole_modules.add(obj.__name__)
            documented.update(id(getattr(obj, n)) for n in obj.__all__)
    missing = []
    for module_name, name in public_names():
        if (module_name, name) in PROSE:
            if PROSE[(module_name, name)] not in source:
                missing.append(f"{module_name}.{name}")
            continue
        obj = getattr(_module(module_name), name)
        if isinstance(obj, (str, int, float)) or obj is None:
            # A constant: named by a directive of its own path.
            if module_name not in whole_modules and f"::: {module_name}.{name}" not in source:
                missing.append(f"{module_name}.{name}")
            continue
        if id(obj) not in documented:
            missing.append(f"{module_name}.{name}")
    assert not missing, (
        "public names missing from docs/reference/*.md (add a '::: module.name' line): "
        + json.dumps(missing)
    )


def test_dir_lists_the_lazy_names() -> None:
    """`dir(composeai)` shows the attributes loaded on first access too."""
    listed = set(dir(composeai))
    assert set(composeai.__all__) <= listed
    assert set(composeai._LAZY) <= listed


def _built_ids(site: Path) -> set[str]:
    ids: set[str] = set()
    for page in (site / "reference").rglob("*.html"):
        ids.update(re.findall(r'\bid="([^"]+)"', page.read_text(encoding="utf-8")))
    return ids


def test_the_built_site_documents_every_public_name(tmp_path: Path) -> None:
    """`mkdocs build --strict` succeeds, and the built API reference has an
    entry (an anchor) for every public name. CI builds the site just before
    the tests and names it in `COMPOSE_DOCS_SITE`; otherwise it is built here."""
    built = os.environ.get("COMPOSE_DOCS_SITE")
    if built:
        site = Path(built)
    else:
        if importlib.util.find_spec("mkdocs") is None:
            if os.environ.get("CI"):
                pytest.fail("the docs build needs `pip install '.[docs]'` (CI installs it)")
            pytest.skip("mkdocs is not installed (pip install '.[docs]')")
        site = tmp_path / "site"
        result = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-6000:]
    ids = _built_ids(site)
    missing = [
        f"{module}.{name}"
        for module, name in public_names()
        if name not in ids and not any(i.endswith(f".{name}") for i in ids)
    ]
    assert not missing, f"not in the built API reference: {missing}"
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "compose runs" in cli and "--format" in cli and "--version" in cli


# Requirement ids of the specification (`FLOW-12`, `EXT-3`, ...) and issue numbers.
_REQUIREMENT_ID = re.compile(
    r"\b(?:AGENT|ASYNC|BUDGET|CHAT|COMP|ERR|EXT|FLOW|MCP|OBS|OPS|PKG|PROV|STORE|TEST)-\d+\b"
    r"|\bissue \d+\b"
)


def test_docstrings_say_what_things_do_not_which_requirement() -> None:
    """No docstring of the package cites a requirement id or an issue number:
    the API reference is generated from them."""
    import ast

    found = []
    package = ROOT / "python" / "composeai"
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False) or ""
                for hit in _REQUIREMENT_ID.findall(doc):
                    line = getattr(node, "lineno", 1)
                    found.append(f"{path.relative_to(ROOT)}:{line} {hit}")
    assert found == []
