"""Shared CLI plumbing: turning known errors into one-line messages, naming fields as the user
typed them, confirmations. Nothing here needs the server package (``app``): the database
commands' own plumbing is in :mod:`cli.database`."""

from __future__ import annotations

import re
from typing import Any, NoReturn

import typer
from respool_client.errors import field_led
from typer._click.globals import get_current_context  # Typer vendors click

__all__ = [
    "BadValue",
    "CliError",
    "KNOWN_ERRORS",
    "USAGE",
    "confirm",
    "describe_error",
    "exit_code_of",
    "fail",
    "names_parameter",
    "user_message",
]

# Exit codes (docs/cli.md, "Errors and exit codes"): 1 when the API or the database refused or
# failed, 2 for a usage error (also a malformed value the user typed, found here or by the API).
FAILED = 1
USAGE = 2


class CliError(Exception):
    """A user-facing failure: printed as ``error: <message>``, exit code 1."""

    exit_code = FAILED


class BadValue(CliError):
    """A malformed value the user typed (an option or an argument): exit code 2, as click's
    usage errors."""

    exit_code = USAGE


def exit_code_of(exc: BaseException) -> int:
    """The exit code of a known error: 2 for a :class:`BadValue`, else 1."""
    return exc.exit_code if isinstance(exc, CliError) else FAILED


# The database commands add theirs (cli.database.DATABASE_ERRORS) where they run.
KNOWN_ERRORS: tuple[type[BaseException], ...] = (
    CliError,
    OSError,  # a file that cannot be read, a port already in use, ...
    TimeoutError,
)


# The one mapping of error fields (API answers, engine errors) to the command's parameter where
# their names differ; the parameter then names itself as the user typed it (``--grace``, ``NAME``).
_PARAM_OF_FIELD = {
    "preemption_grace_seconds": "grace",
    "resources": "resource",
    "resources.gpu_memory_mb": "gpu_memory",
    "resources.gpu_share": "gpu_share",
    "labels": "label",
    "lease_seconds": "lease",
    "settings.memory": "memory",
    "settings.cpu_count": "cpu",
    "settings.gpu_count": "gpu",
    "subject_patterns": "subject",
    "windows": "window",
}

# ``windows[1].timezone``: the item of a list the user gave (one ``--window`` of several).
_ITEM = re.compile(r"^(?P<name>[a-z_]+)\[(?P<index>[0-9]+)\]$")


def _param_label(field: str) -> tuple[str, str] | None:
    """(label, rest of the field) of the current command's parameter that ``field`` names:
    ``capacity.gpu`` → (``--capacity``, ``gpu``), ``settings.memory`` → (``--memory``, ``""``)."""
    ctx = get_current_context(silent=True)
    if ctx is None:
        return None
    head, _, rest = field.partition(".")
    name, rest = (_PARAM_OF_FIELD[field], "") if field in _PARAM_OF_FIELD else (head, rest)
    item = _ITEM.match(name)
    if item is not None:  # the API's names inside an item mean nothing to the user: name the item
        name, rest = item["name"], ""
    name = _PARAM_OF_FIELD.get(name, name)
    for param in ctx.command.params:
        if param.name == name:
            if param.param_type_name == "option":
                label = max(param.opts, key=len)
            else:
                label = param.metavar or (param.name or field).upper()
            typed = ctx.params.get(name)
            if item is not None and isinstance(typed, list | tuple) and len(typed) > 1:
                index = int(item["index"])
                if index < len(typed):
                    label = f"{label} {str(typed[index])!r}"
            return label, rest
    return None


def names_parameter(field: str | None) -> bool:
    """Whether ``field`` (of an API or engine error) is a value the user typed: an option or
    an argument of the current command."""
    return field is not None and _param_label(field) is not None


def user_message(detail: str, field: str | None) -> str:
    """``detail`` with the field it is about named as the user typed it: ``capacity.gpu must
    be ...`` → ``--capacity: gpu must be ...``; ``delete with force`` → ``delete with --force``."""
    found = _param_label(field) if field else None
    if field is None or found is None:
        return detail
    label, rest = found
    led = field_led(detail, field, label, rest)
    if led is not None:
        return led
    word = re.compile(rf"\b{re.escape(field)}\b")
    if not detail.startswith(field) and word.search(detail):
        return word.sub(label, detail, count=1)
    return f"{label}: {detail}"


def describe_error(exc: BaseException) -> str:
    """``exc`` as one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def fail(message: str, code: int = FAILED) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def given_of(options: object, *names: str, **renamed: str) -> dict[str, Any]:
    """The body fields the user gave among the attributes ``names`` of ``options`` (an option
    group) and those ``renamed`` (body field: attribute): the ones left at ``None`` dropped."""
    pairs = {name: name for name in names} | renamed
    values = {field: getattr(options, name) for field, name in pairs.items()}
    return {field: value for field, value in values.items() if value is not None}


def confirm(question: str, *, yes: bool) -> None:
    """Ask ``question`` on stderr unless ``yes``; anything but yes (also no input) aborts."""
    if yes:
        return
    try:
        answer = typer.confirm(question, default=False, err=True)
    except typer.Abort:  # no input (EOF) or Ctrl-C: end the prompt's line
        typer.echo(err=True)
        raise
    if not answer:
        raise typer.Abort()
