"""Options shared by many commands, defined once (``Annotated`` types for Typer signatures)."""

from __future__ import annotations

from difflib import get_close_matches
from enum import StrEnum
from typing import Annotated, Any

import typer
from respool_client.wire import STATUSES

from cli.common import BadValue
from cli.complete import complete_pool, complete_status
from cli.maps import parse_map

__all__ = [
    "DEFAULT_URL",
    "MAP",
    "Description",
    "Force",
    "Output",
    "OutputFormat",
    "PoolRef",
    "StatusFilter",
    "Token",
    "Url",
    "Yes",
    "check_status",
    "map_option",
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
