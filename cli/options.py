"""Options shared by many commands, defined once (``Annotated`` types for Typer signatures)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import MISSING
from difflib import get_close_matches
from enum import StrEnum
from typing import Annotated, Any, TypeVar, get_type_hints

import typer
from respool_client.wire import STATUSES

from cli.api import Api, connect_api
from cli.common import BadValue
from cli.complete import complete_pool, complete_status
from cli.maps import parse_map

_KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY
Command = TypeVar("Command", bound=Callable[..., Any])

__all__ = [
    "DEFAULT_URL",
    "MAP",
    "Description",
    "Force",
    "Output",
    "OutputFormat",
    "PoolRef",
    "Remote",
    "Shown",
    "StatusFilter",
    "Token",
    "Url",
    "Yes",
    "check_status",
    "map_option",
    "Typer",
    "option_groups",
]

DEFAULT_URL = "http://127.0.0.1:8080"
MAP = "MAP"  # the metavar of a JSON or YAML map of resource key to amount
_CONNECTION = "Connection"


class OutputFormat(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"


Url = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="RESPOOL_URL",
        help="Base URL of the respool API.",
        rich_help_panel=_CONNECTION,
    ),
]
Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="RESPOOL_TOKEN",
        help="API token (Authorization: Bearer).",
        show_default=False,
        rich_help_panel=_CONNECTION,
    ),
]
Output = Annotated[
    OutputFormat,
    typer.Option(
        "-o",
        "--output",
        help="table for people (fits the terminal), wide (every column, uncut), json or"
        " yaml for scripts.",
    ),
]
Yes = Annotated[bool, typer.Option("-y", "--yes", help="Do not ask for confirmation.")]
Force = Annotated[
    bool,
    typer.Option("--force", help="Also cancel its queued and allocated requests."),
]
PoolRef = Annotated[
    str,
    typer.Argument(
        help="Pool name, id or unique id prefix (>= 4 hex).", autocompletion=complete_pool
    ),
]


def map_option(*names: str, help: str) -> Any:
    """An option whose value is a map of resource key to amount, JSON or YAML."""
    return typer.Option(*names, parser=parse_map, metavar=MAP, help=help)


Description = Annotated[str | None, typer.Option("-d", "--description", help="Free text.")]

StatusFilter = Annotated[
    str | None,
    typer.Option(
        "--status",
        metavar="STATUS",
        autocompletion=complete_status,
        help="Only this status: " + ", ".join(STATUSES) + ".",
    ),
]


def check_status(status: str | None) -> None:
    """``--status``: one of the statuses; a bad value lists them (exit 2)."""
    if status is None or status in STATUSES:
        return
    close = get_close_matches(status, STATUSES, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise BadValue(f"--status: {status!r} is not a status{hint}; use one of {', '.join(STATUSES)}")


@dataclasses.dataclass(frozen=True)
class Remote:
    """``--url`` and ``--token``: the API a command calls and who calls it."""

    url: Url = DEFAULT_URL
    token: Token = None

    def api(self) -> AbstractContextManager[Api]:
        return connect_api(self.url, self.token)


@dataclasses.dataclass(frozen=True)
class Shown(Remote):
    """:class:`Remote` and ``-o/--output``: how the answer is shown (the connection options
    stand in a panel of their own, so ``--output`` still reads last among the others)."""

    output: Output = OutputFormat.table


def _parameter(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    if default is MISSING:
        default = inspect.Parameter.empty
    return inspect.Parameter(name, _KEYWORD_ONLY, annotation=annotation, default=default)


def option_groups(command: Callable[..., None]) -> Callable[..., None]:
    """Let a command take option groups: each parameter typed with a dataclass (such as
    :class:`Shown`) stands, for Typer, as that dataclass's fields (``Annotated`` options with
    their defaults) in its place; the command gets the dataclass built from them. An option
    list shared by several commands is so declared once."""
    hints = get_type_hints(command, include_extras=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, tuple[Callable[..., Any], list[str]]] = {}
    for param in inspect.signature(command).parameters.values():
        kind = hints.get(param.name, param.annotation)
        if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
            params.append(param.replace(kind=_KEYWORD_ONLY, annotation=kind))
            continue
        types = get_type_hints(kind, include_extras=True)
        fields = [f for f in dataclasses.fields(kind) if f.init]
        groups[param.name] = (kind, [f.name for f in fields])
        params += [_parameter(f.name, types[f.name], f.default) for f in fields]
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise TypeError(f"{command.__name__}: an option named twice in {names}")

    @functools.wraps(command)
    def call(**values: Any) -> None:
        for name, (kind, fields) in groups.items():
            values[name] = kind(**{f: values.pop(f) for f in fields})
        command(**values)

    del call.__wrapped__  # Typer reads the signature below, not the command's
    call.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: p.annotation for p in params}
    return call


class Typer(typer.Typer):
    """A Typer whose commands may take option groups (:func:`option_groups`)."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Command], Command]:
        register = super().command(*args, **kwargs)

        def decorator(command: Command) -> Command:
            register(option_groups(command))
            return command

        return decorator
