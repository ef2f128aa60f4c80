"""A flow's source fingerprint without `inspect` on the common path.

A flow's fingerprint is the SHA-256 of `textwrap.dedent(inspect.
getsource(fn))`. Importing `inspect` (with `ast`, `dis`, `tokenize` and `re`)
and tokenizing the file cost a fresh process several milliseconds, so for a
plain function in a plain UTF-8 `.py` file decoration only snapshots the
file's lines (read as `linecache` reads them); the fingerprint is computed
from that snapshot when first needed, and a resume checks a stored
fingerprint against the snapshot without tokenizing when the block's end is
unambiguous. Anything else takes `inspect`'s own path, unchanged.
"""

from __future__ import annotations

import os

from . import _core

_FunctionType = type(lambda: None)
# filename -> ((mtime_ns, size), lines): one read per file for all its flows.
_MAX_CANDIDATES = 16
_FILES: dict[str, tuple[tuple[int, int], list[str]]] = {}


def _read_lines(filename: str) -> list[str] | None:
    """The file's lines as `linecache` gives them to `inspect` (universal
    newlines, a final newline added), or None when only `linecache`'s own
    decoding rules could say (a coding cookie, undecodable bytes)."""
    try:
        st = os.stat(filename)
    except OSError:
        return None
    key = (st.st_mtime_ns, st.st_size)
    cached = _FILES.get(filename)
    if cached is not None and cached[0] == key:
        return cached[1]
    try:
        with open(filename, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    # PEP 263: a cookie may only sit on the first two lines.
    if b"coding" in b"\n".join(data.split(b"\n", 2)[:2]):
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    lines = [line + "\n" for line in lines]
    _FILES[filename] = (key, lines)
    return lines


def _is_header(line: str) -> bool:
    """`inspect.findsource`'s test for the line a function's source starts
    at, for the forms it can start with at `co_firstlineno`."""
    s = line.lstrip()
    if s.startswith("@"):
        return True
    if s.startswith("async") and s[5:6].isspace():
        s = s[5:].lstrip()
    return s.startswith("def") and s[3:4].isspace()


def _leading(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t\f"))]


def dedent(text: str) -> str:
    """`textwrap.dedent`, without `re`: whitespace-only lines become empty,
    and the longest common leading run of spaces and tabs is removed."""
    lines = text.split("\n")
    margin: str | None = None
    for i, line in enumerate(lines):
        stripped = line.lstrip(" \t")
        if not stripped:
            lines[i] = ""
            continue
        indent = line[: len(line) - len(stripped)]
        if margin is None or indent.startswith(margin):
            margin = indent if margin is None else margin
        elif margin.startswith(indent):
            margin = indent
        else:
            n = 0
            for x, y in zip(margin, indent):
                if x != y:
                    break
                n += 1
            margin = margin[:n]
    if margin:
        cut = len(margin)
        lines = [line[cut:] if line.startswith(margin) else line for line in lines]
    return "\n".join(lines)


class Source:
    """Where a flow's source starts, snapshotted at decoration."""

    __slots__ = ("lines", "start")

    def __init__(self, lines: list[str], start: int):
        self.lines = lines
        self.start = start

    def fingerprint(self) -> str:
        import inspect
        import textwrap

        block = inspect.getblock(self.lines[self.start :])
        return _core.sha256_hex(textwrap.dedent("".join(block)))

    def matches(self, fingerprint: str) -> bool:
        """True when the snapshot's source certainly has this fingerprint,
        found without tokenizing; False means only `inspect` can tell.

        A candidate end is the last line before a statement line at the
        header's indentation or less (or the end of the file), past blank
        lines and comments indented no deeper than the header. `inspect`'s
        block ends there whenever the text up to it is a whole block, and a
        matching hash proves it is: it is the text `inspect` returned when
        the fingerprint was made."""
        lines, start = self.lines, self.start
        head = _leading(lines[start])
        if head.strip(" "):
            return False
        width = len(head)
        last = start
        # A miss stops at the next definition after the body (or after a
        # bounded number of candidates), so it stays linear in the file.
        tries = _MAX_CANDIDATES
        def_seen = _is_header(lines[start]) and not lines[start].lstrip().startswith("@")
        in_body = False
        for j in range(start + 1, len(lines) + 1):
            if j < len(lines):
                line = lines[j]
                body = line.strip(" \t\f\n")
                if not body:
                    continue
                lead = _leading(line)
                low = not lead.strip(" ") and len(lead) <= width
                if not low or body.startswith("#"):
                    if not low:
                        last = j
                        in_body = def_seen
                    continue
            candidate = lines[start : last + 1]
            if any(_leading(x).strip(" ") for x in candidate):
                return False  # tabs or form feeds: columns are tokenize's to count
            if _core.sha256_hex(dedent("".join(candidate))) == fingerprint:
                return True
            tries -= 1
            if not tries or j == len(lines):
                return False
            if _is_header(lines[j]):
                if in_body:
                    return False  # the next definition: leave it to `inspect`
                def_seen = def_seen or not lines[j].lstrip().startswith("@")
            last = j
        return False


def snapshot(fn: object) -> Source | None:
    """The source snapshot of a plain function in a readable UTF-8 `.py`
    file, or None (the caller then asks `inspect` at once)."""
    if type(fn) is not _FunctionType or hasattr(fn, "__wrapped__"):
        return None
    code = fn.__code__  # type: ignore[attr-defined]
    filename = code.co_filename
    if not filename.endswith(".py"):
        return None
    lines = _read_lines(filename)
    start = code.co_firstlineno - 1
    if lines is None or not 0 <= start < len(lines) or not _is_header(lines[start]):
        return None
    return Source(lines, start)
