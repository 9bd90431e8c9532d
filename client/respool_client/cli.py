"""The ``respool`` console script of both distributions.

``respool-client`` and the ``respool`` server both declare ``respool = respool_client.cli:main``.
``respool run`` and ``respool agent`` are always served here, without loading the server's CLI,
so that ``run``'s first status line comes at once. Every other command goes to the server's CLI
when one is installed: the ``respool`` distribution registers it as the entry point ``main`` of
the group :data:`SERVER_CLI_GROUP` (its Typer app also lists ``run`` and ``agent``, delegating
back to :mod:`respool_client.run` and :mod:`respool_client.agent`). The client names no module
of the server; with the client alone, any other command says what to install.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable, Sequence

__all__ = ["SERVER_CLI_GROUP", "main"]

# The entry-point group the server distribution registers its CLI in (its pyproject.toml,
# [project.entry-points."respool.cli"]).
SERVER_CLI_GROUP = "respool.cli"


def _server_cli() -> Callable[[], object] | None:
    """The server CLI's entry point, when a distribution registers one (None otherwise)."""
    for entry in importlib.metadata.entry_points(group=SERVER_CLI_GROUP, name="main"):
        loaded: Callable[[], object] = entry.load()
        return loaded
    return None


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "run":
        from respool_client.run import main as run_main

        sys.exit(run_main(args[1:]))
    if args and args[0] == "agent":
        from respool_client.agent import main as agent_main

        sys.exit(agent_main(args[1:]))
    server = _server_cli() if argv is None else None
    if server is not None:
        server()
        return
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: respool run [options] -- CMD [ARGS...]\n"
            "       respool agent [--node NAME [--register [--detect]] | --pool P]\n"
            "(the light client serves `respool run` and `respool agent` only; "
            "`respool run --help` for their options)"
        )
        sys.exit(0 if args else 2)
    print(
        f"respool: install the respool server CLI for `respool {args[0]}` "
        "(this is the light client, which serves `respool run` and `respool agent` only)",
        file=sys.stderr,
    )
    sys.exit(2)
