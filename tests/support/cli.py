"""``respool`` through Typer's runner (:class:`Cli`); the one-line error check (:func:`failed`)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from typer.testing import CliRunner, Result

from cli.main import app

__all__ = ["Cli", "failed"]


@dataclass
class Cli:
    """Runs ``respool`` commands: :meth:`api` against the server, :meth:`db` on its database."""

    url: str
    db_url: str
    runner: CliRunner = field(default_factory=CliRunner)

    async def run(self, *args: str, input: str | None = None, **env: str | None) -> Result:
        environ: dict[str, str | None] = {
            "RESPOOL_URL": None,
            "RESPOOL_TOKEN": None,
            "COLUMNS": None,
            **env,
        }
        return await asyncio.to_thread(
            self.runner.invoke, app, list(args), input=input, env=environ
        )

    async def api(self, *args: str, input: str | None = None, **env: str | None) -> Result:
        return await self.run(*args, "--url", self.url, input=input, **env)

    async def db(self, *args: str, input: str | None = None) -> Result:
        return await self.run(*args, input=input, RESPOOL_DATABASE_URL=self.db_url)

    async def ok(self, *args: str, input: str | None = None) -> Result:
        """``api(...)`` that must succeed, with no traceback anywhere."""
        result = await self.api(*args, input=input)
        assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
        assert "Traceback" not in result.output
        return result

    async def json(self, *args: str, input: str | None = None) -> Any:
        """``api(..., "-o", "json")``: the parsed stdout (data only; messages go to stderr)."""
        return json.loads((await self.ok(*args, "-o", "json", input=input)).stdout)


def failed(result: Result, code: int = 1) -> str:
    """Assert a one-line ``error: ...`` on stderr, nothing on stdout, and ``code``."""
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    assert result.stdout == ""
    err = result.stderr
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err.removeprefix("error: ").strip()
