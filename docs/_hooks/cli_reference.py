"""MkDocs hook: renders the `compose` command-line reference from the CLI's
own argparse parser, so the page can never disagree with `compose --help`.

A page holding the line `<!-- compose-cli-reference -->` gets it replaced
by one section per command (its usage, description and a table of its
arguments), sub-commands included.
"""

from __future__ import annotations

import argparse
from typing import Any

MARKER = "<!-- compose-cli-reference -->"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, Any]]:
    """`(name, help, parser)` of each sub-command, in declaration order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _cell(text: str) -> str:
    # Help texts say `<N>d`: shown as text, not taken for HTML tags.
    return (
        text.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("|", "\\|")
        .replace("\n", " ")
    )


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)):
            continue
        if action.option_strings:
            name = ", ".join(f"`{o}`" for o in action.option_strings)
            if action.nargs != 0:
                name += f" `{action.metavar or action.dest.upper()}`"
        else:
            name = f"`{action.metavar or action.dest}`"
        what = action.help or ""
        if action.choices is not None and not isinstance(action.choices, dict):
            what += f" (one of: {', '.join(f'`{c}`' for c in action.choices)})"
        rows.append(f"| {name} | {_cell(what)} |")
    return rows


def _section(path: str, help_text: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    out = [f"{'#' * level} `{path}`", ""]
    if help_text:
        out += [help_text[0].upper() + help_text[1:] + ".", ""]
    out += ["```text", parser.format_usage().strip(), "```", ""]
    rows = _argument_rows(parser)
    if rows:
        out += ["| Argument | What it does |", "| --- | --- |", *rows, ""]
    for name, sub_help, sub in _subcommands(parser):
        out += _section(f"{path} {name}", sub_help, sub, level + 1)
    return out


def render() -> str:
    """The command-line reference as Markdown."""
    from composeai.cli import _build_parser

    parser = _build_parser()
    lines = [parser.description or "", ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    lines += ["| Argument | What it does |", "| --- | --- |", *_argument_rows(parser), ""]
    for name, sub_help, sub in _subcommands(parser):
        lines += _section(f"compose {name}", sub_help, sub, 2)
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
