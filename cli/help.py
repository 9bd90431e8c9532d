"""Help that reads well at 80 columns, from the docstrings as written.

Applied to every command once, before the command line is parsed:

* prose paragraphs are joined into one line each, so rich wraps them at the terminal's width
  (a docstring's own line breaks are kept only for list items);
* the ``Example:`` block moves to the epilog under a bold ``Examples`` heading, one command a
  line; a command longer than :data:`EXAMPLE_WIDTH` is continued with ``\\`` before an option,
  never cut mid-word;
* metavars are plain words (``POOL``, ``N``, ``table|wide|json|yaml``) and flags have none.
"""

from __future__ import annotations

import inspect
import re
from decimal import Decimal
from typing import get_args

from typer._click.core import Command, Context, Parameter  # Typer vendors click
from typer.core import TyperGroup, TyperOption

__all__ = ["EXAMPLE_WIDTH", "tidy", "with_examples"]

# An example line longer than this is continued on the next (80 columns less the epilog's
# padding and a little room).
EXAMPLE_WIDTH = 76
_EXAMPLES = re.compile(r"^(Examples?):\s*$", re.MULTILINE)
_LIST_ITEM = re.compile(r"^\s*(?:[-*] |\d+\. )")
_CHOICES_WIDTH = 26
_WORD = re.compile(r"""(?:'[^']*'|"[^"]*"|[^\s'"])+""")


def tidy(command: Command) -> None:
    """Rewrite ``command``'s help, epilog and metavars, and those of its subcommands, once."""
    if getattr(command, "_respool_tidy", False):
        return
    command._respool_tidy = True  # type: ignore[attr-defined]
    if command.help:
        command.help, examples = _split(command.help)
        if examples:
            command.epilog = examples
    for param in command.params:
        _plain_metavar(param)
    help_option = command.get_help_option(Context(command))
    if help_option is not None:
        help_option.metavar = ""
    if isinstance(command, TyperGroup):  # a lazy group's loaded commands only (cli/group.py)
        subs = command.loaded if hasattr(command, "loaded") else command.commands
        for sub in subs.values():
            tidy(sub)


def with_examples(text: str, *examples: str) -> str:
    """The help of a command made by a factory: ``text``, then its ``Example:`` block."""
    return "\n\n".join((text, "Example:", "\n".join(f"    {line}" for line in examples)))


def _split(text: str) -> tuple[str, str | None]:
    """(the prose with its paragraphs joined, the examples as an epilog or None)."""
    prose, *examples = _EXAMPLES.split(inspect.cleandoc(text), maxsplit=1)
    epilog = None
    if examples:
        lines = [line.strip() for line in examples[-1].splitlines() if line.strip()]
        epilog = "[bold]Examples[/bold]\n\n" + "\n".join(_examples(lines))
    return "\n\n".join(_paragraph(p) for p in prose.strip().split("\n\n")), epilog


def _paragraph(text: str) -> str:
    """One line for prose; a list keeps an item a line."""
    out: list[str] = []
    for line in text.splitlines():
        if out and not _LIST_ITEM.match(line):
            out[-1] += " " + line.strip()
        else:
            out.append(line.rstrip())
    return "\n".join(out)


def _examples(lines: list[str]) -> list[str]:
    """One command a line; a line continued by hand (``\\``) keeps its continuation."""
    out: list[str] = []
    continued = False
    for line in lines:
        indent = "    " if continued else ""
        continued = line.endswith("\\")
        out.append(_markup(indent + line) if continued else _continue(line, indent))
    return out


def _continue(line: str, indent: str) -> str:
    """``line``, continued with ``\\`` before an option (with its value) where it would pass
    :data:`EXAMPLE_WIDTH`."""
    groups: list[str] = []
    for word in _WORD.findall(line):
        if groups and not word.startswith("-"):
            groups[-1] += " " + word
        else:
            groups.append(word)
    rows = [indent + groups[0]]
    for group in groups[1:]:
        if len(f"{rows[-1]} {group}") > EXAMPLE_WIDTH:
            rows[-1] += " \\"
            rows.append("    " + group)
        else:
            rows[-1] += " " + group
    return _markup("\n".join(rows))


def _markup(text: str) -> str:
    """``text`` shown as it is (no rich markup)."""
    return text.replace("[", r"\[")


def _plain_metavar(param: Parameter) -> None:
    """``POOL``, ``N``, ``a|b|c`` instead of ``<str>``, ``<int>``, ``<bool>``; none for a flag."""
    if isinstance(param, TyperOption):
        if param.metavar is not None:
            return
        if param.is_flag or param.count:
            param.metavar = ""
            return
        param.metavar = _word(param)
        return
    if param.metavar is None:
        param.metavar = (param.name or "value").upper()
    # an argument's name is its metavar: no type next to it
    setattr(param, "display_type_rich", lambda ctx: None)  # noqa: B010


def _word(param: TyperOption) -> str:
    kind = param.type_descriptor
    if kind.is_choice and kind.choices:
        text = "|".join(str(c) for c in kind.choices)
        if len(text) <= _CHOICES_WIDTH:
            return text
    annotation = get_args(kind.annotation)[0] if kind.is_list else kind.annotation
    if annotation is int:
        return "N"
    if annotation in (float, Decimal):
        return "NUMBER"
    return (param.name or "value").upper().replace("_", "-")
