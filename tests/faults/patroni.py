"""A real PostgreSQL HA cluster for the failover test: one etcd and two Patroni-managed
PostgreSQL 15 nodes on 127.0.0.1, synchronous replication on (Patroni's ``synchronous_mode``).

Everything lives in one temporary directory and listens on free loopback ports; the machine's own
PostgreSQL is never touched. Needs Debian's ``patroni``, ``python3-etcd`` and ``etcd-server``
(``tests/faults/install-ha.sh``) and PostgreSQL 15's binaries; :func:`missing` says what is absent
so the test can skip. As root, the nodes run as the ``postgres`` system user (PostgreSQL refuses
root).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from support.ports import free_port

__all__ = ["PG_BIN", "PatroniCluster", "missing"]

PG_BIN = Path(os.environ.get("RESPOOL_HA_PG_BIN", "/usr/lib/postgresql/15/bin"))
PATRONI = "/usr/bin/patroni"  # Debian's, run by the system python3 (python3-etcd)
PATRONICTL = "/usr/bin/patronictl"
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
_RUN_AS = "postgres"


def missing() -> str | None:
    """Why the cluster cannot run here (a missing program), or None."""
    for path in (PATRONI, PATRONICTL, ETCD, str(PG_BIN / "postgres")):
        if not os.access(path, os.X_OK):
            return f"{path} is not installed (tests/faults/install-ha.sh)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(_RUN_AS)
        except KeyError:
            return f"no {_RUN_AS!r} system user to run PostgreSQL as"
    probe = subprocess.run(
        ["/usr/bin/python3", "-c", "import etcd"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        return "python3-etcd is not installed (tests/faults/install-ha.sh)"
    return None


class PatroniCluster:
    """etcd + two Patroni nodes (``node1``, ``node2``); :attr:`dsn` is the multi-host DSN."""

    NODES = ("node1", "node2")

    def __init__(self, database: str = "respool") -> None:
        self.base = Path(tempfile.mkdtemp(prefix="respool-ha-"))
        self.database = database
        self.etcd_port, self.etcd_peer = free_port(), free_port()
        self.pg_ports = {n: free_port() for n in self.NODES}
        self.rest_ports = {n: free_port() for n in self.NODES}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._run_as: dict[str, Any] = {}
        if os.geteuid() == 0:
            self._run_as = {"user": _RUN_AS, "group": pwd.getpwnam(_RUN_AS).pw_gid}
            uid = pwd.getpwnam(_RUN_AS)
            self.base.chmod(0o755)
            os.chown(self.base, uid.pw_uid, uid.pw_gid)

    # --- addresses ---

    def node_dsn(self, node: str, database: str | None = None) -> str:
        port = self.pg_ports[node]
        return f"postgresql://postgres@127.0.0.1:{port}/{database or self.database}"

    @property
    def dsn(self) -> str:
        """Both nodes, and only the one that accepts writes: what respool is given."""
        hosts = ",".join(f"127.0.0.1:{self.pg_ports[n]}" for n in self.NODES)
        return f"postgresql://postgres@{hosts}/{self.database}?target_session_attrs=read-write"

    def node_of_port(self, port: int) -> str:
        return next(n for n, p in self.pg_ports.items() if p == port)

    # --- lifecycle ---

    def _config(self, node: str) -> str:
        conf: dict[str, Any] = {
            "scope": "respool-ha",
            "name": node,
            "log": {"level": "INFO", "dir": str(self.base / f"{node}-log")},
            "restapi": {
                "listen": f"127.0.0.1:{self.rest_ports[node]}",
                "connect_address": f"127.0.0.1:{self.rest_ports[node]}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": 20,
                    "loop_wait": 1,
                    "retry_timeout": 5,
                    "maximum_lag_on_failover": 16 * 1024 * 1024,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "wal_log_hints": "on",
                            "max_connections": 200,
                            "max_wal_senders": 5,
                            "max_replication_slots": 5,
                            "fsync": "off",  # a test cluster on a shared machine: no disk flushes
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_ports[node]}",
                "connect_address": f"127.0.0.1:{self.pg_ports[node]}",
                "data_dir": str(self.base / node),
                "bin_dir": str(PG_BIN),
                "pgpass": str(self.base / f"{node}.pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(self.base)},
            },
        }
        path = self.base / f"{node}.yml"
        path.write_text(json.dumps(conf, indent=1))  # JSON is YAML
        (self.base / f"{node}-log").mkdir(exist_ok=True)
        if self._run_as:
            uid = pwd.getpwnam(_RUN_AS)
            for p in (path, self.base / f"{node}-log"):
                os.chown(p, uid.pw_uid, uid.pw_gid)
        return str(path)

    def _spawn(self, name: str, args: list[str], **kw: Any) -> None:
        with open(self.base / f"{name}.out", "ab") as out:
            self._procs[name] = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, cwd=self.base, **kw
            )

    def start(self, within: float = 120.0) -> float:
        """Start etcd, then node1 (it bootstraps), then node2 (it clones node1); wait until
        node1 leads and node2 is its synchronous standby. Returns the seconds it took."""
        t = time.monotonic()
        peer = f"http://127.0.0.1:{self.etcd_peer}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn(
            "etcd",
            [
                ETCD, "--name", "e1", "--data-dir", str(self.base / "etcd"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"e1={peer}", "--initial-cluster-state", "new",
            ],
        )  # fmt: skip
        self._wait(lambda: self._http(f"{client}/health") is not None, "etcd", within)
        first, *others = self.NODES
        self._spawn(first, [PATRONI, self._config(first)], **self._run_as)
        self._wait(lambda: self.leader() == first, f"{first} to lead", within)
        for node in others:
            self._spawn(node, [PATRONI, self._config(node)], **self._run_as)
        self._wait(lambda: self.sync_standby() is not None, "a synchronous standby", within)
        return time.monotonic() - t

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the members (``GET /cluster`` on any node that answers)."""
        for node in self.NODES:
            doc = self._http(f"http://127.0.0.1:{self.rest_ports[node]}/cluster")
            if doc is not None:
                members: list[dict[str, Any]] = doc.get("members", [])
                return members
        return []

    def leader(self) -> str | None:
        """The node that leads and runs (``role`` leader, ``state`` running), if any."""
        for m in self.members():
            if m.get("role") == "leader" and m.get("state") == "running":
                return str(m["name"])
        return None

    def sync_standby(self) -> str | None:
        """The streaming synchronous standby, if any."""
        for m in self.members():
            if m.get("role") == "sync_standby" and m.get("state") in ("running", "streaming"):
                return str(m["name"])
        return None

    def switchover(self, candidate: str) -> None:
        """``patronictl switchover --candidate``: a planned change of primary."""
        leader = self.leader()
        assert leader is not None and leader != candidate
        self._ctl("switchover", "--leader", leader, "--candidate", candidate, "--force")

    def postmaster_pid(self, node: str) -> int:
        return int((self.base / node / "postmaster.pid").read_text().split("\n", 1)[0])

    def kill_postmaster(self, node: str) -> int:
        """``kill -9`` of ``node``'s postmaster; returns its PID."""
        pid = self.postmaster_pid(node)
        os.kill(pid, signal.SIGKILL)
        return pid

    def _ctl(self, *args: str) -> str:
        conf = str(self.base / f"{self.NODES[0]}.yml")
        done = subprocess.run(
            [PATRONICTL, "-c", conf, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            **self._run_as,
        )
        if done.returncode != 0:
            raise RuntimeError(f"patronictl {' '.join(args)}: {done.stdout}{done.stderr}")
        return str(done.stdout)

    @staticmethod
    def _http(url: str) -> Any:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback http
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def _wait(self, check: Any, what: str, within: float) -> None:
        start = time.monotonic()
        while not check():
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited {proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() - start > within:
                raise RuntimeError(f"timed out waiting for {what}:\n{self.log_tail()}")
            time.sleep(0.2)

    def wait_for(self, check: Any, what: str, within: float = 60.0) -> float:
        """Block until ``check()``; seconds (RuntimeError with the logs after ``within``)."""
        t = time.monotonic()
        self._wait(check, what, within)
        return time.monotonic() - t

    def log_tail(self, chars: int = 3000) -> str:
        parts = []
        for name in ("etcd", *self.NODES):
            with contextlib.suppress(OSError):
                text = (self.base / f"{name}.out").read_text(errors="replace")[-chars:]
                parts.append(f"--- {name} ---\n{text}")
        return "\n".join(parts)

    def destroy(self) -> None:
        """Stop the Patroni nodes (each stops its PostgreSQL), then etcd; remove everything."""
        for name in (*self.NODES, "etcd"):
            proc = self._procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for node in self.NODES:  # a postmaster that outlived its Patroni
            with contextlib.suppress(OSError, ValueError):
                os.kill(self.postmaster_pid(node), signal.SIGKILL)
        shutil.rmtree(self.base, ignore_errors=True)
