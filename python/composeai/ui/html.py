"""Escaping for the UI's pages: every stored value reaches HTML through
`esc` or `pretty`, so markup inside stored data is shown as text."""

from __future__ import annotations

import html
import json
from typing import Any


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def pretty(value_json: str | None) -> str:
    """Stored JSON, indented, escaped for a `<pre>`."""
    if value_json is None:
        return ""
    try:
        text = json.dumps(json.loads(value_json), indent=2, ensure_ascii=False)
    except ValueError:
        text = value_json
    return esc(text)
