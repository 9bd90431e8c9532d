"""``respool agent``: run the jobs granted to this node (``docs/jobs.md``, "The agent").

With a token of role ``agent`` (``RESPOOL_TOKEN``), bound to one node (or to a pool without
nodes), it heartbeats its node, long-polls for the jobs placed there that no agent claimed,
claims each attempt once and runs it exactly as ``respool run`` runs CMD (the same
:class:`respool_client.run._Runner`, through a :mod:`respool_client.launcher`): a process group
of its own, the grant's environment plus the job's ``env`` (and ``RESPOOL_ARRAY_INDEX``), the
request heartbeated and long-polled, SIGTERM on ``preempting`` / ``cancelled`` and SIGKILL at
the grace deadline, release with the exit code once the group is gone. stdout and stderr go to
the server in numbered chunks, kept and resent while the API does not answer.

With ``--register`` it first makes sure its node exists, creating it in its token's pool or
updating it (``--detect``: what ``nvidia-smi`` and the OS say, as ``respool node register
--detect``; :mod:`respool_client.detect`). On start it releases its node's claimed jobs
(their processes died with the agent before it: reason ``agent_restarted``). On SIGTERM or
SIGINT it stops its jobs (SIGTERM, SIGKILL after ``--kill-after``), releases them and exits 0.
The agent's token is not passed on to jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
import io
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from respool_client._async import AsyncRespool
from respool_client._status import Status
from respool_client.detect import (
    Machine,
    detect,
    memory_map,
    node_path,
    registration,
    sharing_map,
)
from respool_client.errors import ApiError, RespoolError
from respool_client.grant import Grant
from respool_client.launcher import Launcher, LocalLauncher, Stream
from respool_client.pairs import host_node_name
from respool_client.run import (
    EXIT_API,
    EXIT_USAGE,
    GONE_KILL_AFTER,
    _HelpFormatter,
    _Runner,
    add_connection,
)
from respool_client.wire import Node

__all__ = ["build_parser", "main"]

POLL_WAIT = 30.0  # seconds of each long-poll for new jobs
CHUNK = 32768  # characters per log chunk at most
PENDING_LIMIT = 8 * 1024 * 1024  # characters kept per job while the API does not answer
LOG_FLUSH = 30.0  # seconds to send what is left of a job's output before its release
CLAIM_WAIT = 10.0  # seconds to wait for new claims before polling again


def build_parser(prog: str = "respool agent") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the jobs granted to this node (or to a pool without nodes): claim "
        "each, run it in its own process group with the grant's environment, send its output, "
        "stop it when preempted or cancelled, release it with its exit code.",
        epilog="Examples:\n"
        f"  RESPOOL_TOKEN=... {prog} --node gpu-box-1\n"
        f"  RESPOOL_TOKEN=... {prog} --node gpu-box-1 --register --detect\n"
        f"  RESPOOL_TOKEN=... {prog} --pool cpu-pool --interval 5",
        formatter_class=_HelpFormatter,
    )
    add_connection(parser, token_help="A token of role agent (RESPOOL_TOKEN).")
    add = parser.add_argument
    add("--node", metavar="NAME",
        help="The node this agent serves; must be the token's node (a check).")  # fmt: skip
    add("--pool", metavar="POOL",
        help="The pool (without nodes) this agent serves; must be the token's.")  # fmt: skip
    add("--register", action="store_true",
        help="First make sure the node exists: create it in the token's pool, or update it. "
        "The token must be bound to this node. --node defaults to this host's name.")  # fmt: skip
    add("--detect", action="store_true",
        help="With --register: GPUs from nvidia-smi (ids, a gpu-type label), mcpu and memory_mb "
        "from the OS, as `respool node register --detect` finds them.")  # fmt: skip
    add("--sharing", action="append", default=[], metavar="KEY=MODE",
        help="With --register: share each device of the key in slices, gpu=mps or "
        "gpu=time-slicing (with --detect, its device memory is nvidia-smi's "
        "memory.total).")  # fmt: skip
    add("--device-memory", action="append", default=[], metavar="KEY=SIZE",
        help="With --register: each device's memory of a shared key, gpu=81920 (MiB) or "
        "gpu=80GiB.")  # fmt: skip
    add("--reserved-memory", action="append", default=[], metavar="KEY=SIZE",
        help="With --register: memory kept back per device of a shared key (gpu=512).")  # fmt: skip
    add("--interval", type=int, default=10, metavar="S",
        help="Heartbeat every S seconds (1..300, default 10); not heard for 3 intervals, the "
        "node takes no new jobs.")  # fmt: skip
    add("--kill-after", type=float, default=None, metavar="S",
        help="SIGKILL this long after SIGTERM (default: at the grace deadline of a preemption, "
        f"else {GONE_KILL_AFTER:g} s).")  # fmt: skip
    return parser


class _Logs:
    """One attempt's output on its way to the server: numbered chunks, sent in order, kept and
    resent while the API does not answer (at most :data:`PENDING_LIMIT` characters waiting).

    The first output goes out at once; what arrives while a chunk is on its way waits in
    :attr:`pending` and goes in the next sends (up to :data:`CHUNK` characters each). A chunk
    on its way is never touched again: output is only ever added to chunks not yet sent."""

    def __init__(self, rp: AsyncRespool, request_id: str, attempt: int) -> None:
        self.rp = rp
        self.request_id = request_id
        self.path = f"/v1/requests/{request_id}/logs"
        self.attempt = attempt
        self.seq = 0
        self.pending: list[tuple[Stream, str]] = []  # not sent yet, oldest first
        self.size = 0  # characters pending or on their way
        self.dropped = 0
        self.more = asyncio.Event()
        self.closed = False
        self.gone = False  # the server refused: nothing more is sent
        self.decoders = {
            name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")
        }
        self.task = asyncio.create_task(self._send())

    def write(self, stream: Stream, data: bytes) -> None:
        self.add(stream, self.decoders[stream].decode(data))

    def add(self, stream: Stream, text: str) -> None:
        if not text or self.gone:
            return
        text = text.replace("\x00", "\ufffd")
        if self.size + len(text) > PENDING_LIMIT:
            self.dropped += len(text)
            return
        if self.dropped:
            text = f"[... {self.dropped} characters dropped: the API did not answer ...]\n" + text
            self.dropped = 0
        self.size += len(text)
        if self.pending and self.pending[-1][0] == stream and len(self.pending[-1][1]) < CHUNK:
            head = self.pending[-1][1]
            self.pending[-1] = (stream, head + text[: CHUNK - len(head)])
            text = text[CHUNK - len(head) :]
        while text:
            self.pending.append((stream, text[:CHUNK]))
            text = text[CHUNK:]
        self.more.set()

    async def _send(self) -> None:
        while True:
            await self.more.wait()
            self.more.clear()
            while self.pending:
                stream, data = self.pending.pop(0)  # on its way: no longer added to
                if not await self._post(stream, data):
                    self.gone = True  # 404 / 409: the attempt is no longer ours
                    self.pending.clear()
                    return
                self.size -= len(data)
                self.seq += 1
            if self.closed:
                return

    async def _post(self, stream: Stream, data: str) -> bool:
        """Send chunk :attr:`seq` until the server stores it (True) or refuses it (False)."""
        body = {"attempt": self.attempt, "seq": self.seq, "stream": stream, "data": data}
        while True:
            try:
                await self.rp.call("POST", self.path, body=body)
                return True
            except ApiError as exc:
                if exc.status_code not in (408, 429) and exc.status_code < 500:
                    # 409: a stale attempt (the job was requeued), 404: no longer this node's job
                    print(
                        f"respool agent: job {self.request_id} attempt {self.attempt}: output"
                        f" refused: {exc.detail or exc} (HTTP {exc.status_code}); the rest of"
                        " this run's output is dropped",
                        file=sys.stderr,
                        flush=True,
                    )
                    return False
            except RespoolError:
                pass  # the API does not answer: keep it, try again
            await asyncio.sleep(1.0)

    async def close(self, within: float) -> None:
        """Send what is left (at most ``within`` seconds), then stop."""
        for name, decoder in self.decoders.items():
            self.add(name, decoder.decode(b"", final=True))  # type: ignore[arg-type]
        self.closed = True
        self.more.set()
        await asyncio.wait({self.task}, timeout=within)
        self.task.cancel()


class _JobStatusOut(io.TextIOBase):
    """What the runner says about a job: to the agent's stderr, prefixed with the job's id, and
    into the job's own log (stderr), so ``respool logs`` shows why a command did not run."""

    def __init__(self, prefix: str, logs: _Logs) -> None:
        super().__init__()
        self.prefix = prefix
        self.logs = logs

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        self.logs.add("stderr", text)
        for line in text.splitlines(keepends=True):
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(f"{self.prefix} {line}")
                sys.stderr.flush()
        return len(text)


class Agent:
    def __init__(self, rp: AsyncRespool, args: argparse.Namespace, launcher: Launcher) -> None:
        self.rp = rp
        self.args = args
        self.launcher = launcher
        self.stopping = asyncio.Event()
        self.runners: dict[tuple[str, int], _Runner] = {}
        self.tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        # The jobs' environment: ours without the agent's token.
        self.base_env = {k: v for k, v in os.environ.items() if k != "RESPOOL_TOKEN"}

    def say(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            print(f"respool agent: {text}", file=sys.stderr, flush=True)

    async def hello(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self.rp.call(
            "POST", "/v1/agent/heartbeat", body={"interval_seconds": self.args.interval}
        )
        return answer

    async def beat(self) -> None:
        while True:
            await asyncio.sleep(self.args.interval)
            try:
                await self.rp.call(
                    "POST",
                    "/v1/agent/heartbeat",
                    body={"interval_seconds": self.args.interval},
                    retry_for=self.args.interval,
                )
            except RespoolError as exc:
                self.say(f"heartbeat failed: {exc}")

    async def release_stale(self) -> None:
        """Release the claims of a previous agent of this node: their processes are gone."""
        answer = await self.rp.call("GET", "/v1/agent/jobs", params={"claimed": "true"})
        for doc in answer["items"]:
            key = (doc["id"], doc["attempt"])
            if key in self.tasks:
                continue
            with contextlib.suppress(ApiError):
                await self.rp.call(
                    "POST",
                    f"/v1/requests/{doc['id']}/release",
                    params={"attempt": doc["attempt"]},
                    body={"exit_code": None, "reason": "agent_restarted"},
                )
                self.say(f"job {doc['id']} attempt {doc['attempt']}: released (agent_restarted)")

    def stop(self, sig: int) -> None:
        if self.stopping.is_set():
            for runner in self.runners.values():
                runner._on_wrapper_signal(sig)  # a second signal: SIGKILL now
            return
        self.say(f"got {signal.Signals(sig).name}: stopping {len(self.runners)} job(s)")
        self.stopping.set()
        for runner in self.runners.values():
            runner._on_wrapper_signal(signal.SIGTERM)

    def failed(self, exc: RespoolError) -> int:
        """Say why a call failed (one line); the exit status it means."""
        if isinstance(exc, ApiError):
            self.say(f"error: {exc.detail or exc} (HTTP {exc.status_code})")
            return EXIT_USAGE if exc.status_code in (401, 403) else EXIT_API
        self.say(f"error: {exc}")
        return EXIT_API

    async def register(self) -> int:
        """--register: create the node or make it match what was found (0), else why not."""
        name: str = self.args.node
        asked = self.args.shared
        found = (
            await asyncio.to_thread(detect, sharing=asked["sharing"])
            if self.args.detect
            else Machine()
        )
        for line in found.notes:
            self.say(line)
        try:
            try:
                doc = await self.rp.call("GET", node_path(name))
                old: Node | None = msgspec.convert(doc, Node, strict=False)
            except ApiError as exc:
                if exc.status_code != 404:
                    raise
                old = None
            if not found.capacity and not found.devices:
                if old is None:
                    self.say(
                        f"error: node {name} is not registered, and --register has nothing to "
                        "register it with: add --detect (or add it with respool node add)"
                    )
                    return EXIT_USAGE
                self.say(f"node {name} is registered (--detect would update its units)")
                return 0
            sharing = {k: v for k, v in asked["sharing"].items() if k != "gpu"} | found.sharing
            shared = {
                "sharing": sharing,
                "device_memory_mb": found.device_memory_mb | asked["device_memory_mb"],
                "reserved_memory_mb": asked["reserved_memory_mb"],
            }
            method, path, body = registration(
                old, name, pool=None, capacity=found.capacity, devices=found.devices,
                labels=found.labels, detected=True, **shared,
            )  # fmt: skip
            retry = 0.0 if method == "POST" else None
            node = msgspec.convert(
                await self.rp.call(method, path, body=body, retry_for=retry), Node, strict=False
            )
        except RespoolError as exc:
            return self.failed(exc)
        units = ", ".join(f"{k} {v}" for k, v in sorted(node.capacity.items()))
        where = f"pool {node.pool}" if node.pool else "no pool"
        self.say(f"{'registered' if old is None else 'updated'} node {name} in {where}: {units}")
        return 0

    async def serve(self) -> int:
        if self.args.register:
            code = await self.register()
            if code:
                return code
        try:
            hello = await self.hello()
        except ApiError as exc:
            self.say(f"error: {exc.detail or exc} (HTTP {exc.status_code})")
            return EXIT_USAGE if exc.status_code in (401, 403) else EXIT_API
        except RespoolError as exc:
            self.say(f"error: {exc}")
            return EXIT_API
        node, pool = hello.get("node"), hello.get("pool")
        for option, given, bound in (
            ("--node", self.args.node, node),
            ("--pool", self.args.pool, pool),
        ):
            if given is not None and given != bound:
                self.say(
                    f"error: {option} {given}: the token is bound to node {node} of pool {pool}"
                )
                return EXIT_USAGE
        self.say(f"serving node {node} of pool {pool}" if node else f"serving pool {pool}")
        beat = asyncio.create_task(self.beat())
        try:
            with contextlib.suppress(RespoolError):
                await self.release_stale()
            await self.poll()
            if self.tasks:
                await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        finally:
            beat.cancel()
        self.say("stopped")
        return 0

    async def poll(self) -> None:
        stop = asyncio.create_task(self.stopping.wait())
        while not self.stopping.is_set():
            ask = asyncio.create_task(
                self.rp.call(
                    "GET",
                    "/v1/agent/jobs",
                    params={"wait": POLL_WAIT},
                    http_timeout=POLL_WAIT + 15,
                )
            )
            await asyncio.wait({ask, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not ask.done():
                ask.cancel()
                break
            try:
                answer = ask.result()
            except ApiError as exc:
                self.say(f"asking for jobs failed: {exc}")
                await asyncio.sleep(1.0)
                continue
            except RespoolError as exc:
                self.say(f"asking for jobs failed: {exc}")
                await asyncio.sleep(1.0)
                continue
            claims: list[asyncio.Future[None]] = []
            earlier: set[asyncio.Future[Any]] = set()
            for doc in answer["items"]:
                key = (doc["id"], doc["attempt"])
                if key in self.tasks:
                    continue
                # An earlier attempt of the same job still running here (being stopped: its
                # attempt is stale): the next one is claimed once it is gone, never beside it.
                running = [t for (rid, _), t in self.tasks.items() if rid == doc["id"]]
                if running:
                    earlier.update(running)
                    continue
                claimed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                claims.append(claimed)
                self.tasks[key] = asyncio.create_task(self.run_job(doc, claimed))
                self.tasks[key].add_done_callback(self._done(key))
            if claims:  # the list answers at once while they are unclaimed: claim them first
                await asyncio.wait(claims, timeout=CLAIM_WAIT)
            elif earlier:
                await asyncio.wait(
                    earlier | {stop}, timeout=CLAIM_WAIT, return_when=asyncio.FIRST_COMPLETED
                )
        stop.cancel()

    def _done(self, key: tuple[str, int]) -> Callable[[asyncio.Task[None]], None]:
        def forget(_: asyncio.Task[None]) -> None:
            self.tasks.pop(key, None)

        return forget

    async def run_job(self, doc: dict[str, Any], claimed: asyncio.Future[None]) -> None:
        request_id, attempt = str(doc["id"]), int(doc["attempt"])
        key = (request_id, attempt)
        try:
            sent = time.monotonic()
            try:
                state = await self.rp._request(
                    "POST", f"/v1/requests/{request_id}/claim", body={"attempt": attempt}
                )
            except RespoolError as exc:  # 409: claimed already, or a stale attempt
                self.say(f"job {request_id} attempt {attempt}: not claimed: {exc}")
                return
        finally:
            if not claimed.done():
                claimed.set_result(None)
        job = state.job
        if job is None:
            return
        extra = dict(job.env or {})
        if job.array_index is not None:
            extra["RESPOOL_ARRAY_INDEX"] = str(job.array_index)
        logs = _Logs(self.rp, request_id, attempt)
        name = f"[{job.name or request_id[:8]} #{attempt}]"
        status = Status(_JobStatusOut(name, logs), live=False)  # type: ignore[arg-type]
        ns = argparse.Namespace(kill_after=self.args.kill_after, timeout=None, queue_lease=None)
        runner = _Runner(
            self.rp,
            ns,
            list(job.command),
            launcher=self.launcher,
            status=status,
            base_env=self.base_env,
            extra_env=extra,
            workdir=job.workdir,
            on_output=logs.write,
        )
        self.runners[key] = runner
        if self.stopping.is_set():
            runner._on_wrapper_signal(signal.SIGTERM)
        try:
            code, _last = await runner._one_attempt(Grant(state, sent), 0.0)
        finally:
            self.runners.pop(key, None)
        status.say(f"exited with {code}")
        await logs.close(LOG_FLUSH)
        try:
            await self.rp.call(
                "POST",
                f"/v1/requests/{request_id}/release",
                params={"attempt": attempt},
                body={"exit_code": code, "reason": None},
            )
        except ApiError as exc:
            if exc.status_code not in (404, 409):  # 409: preempted or requeued meanwhile
                self.say(f"job {request_id}: release failed: {exc}")
        except RespoolError as exc:
            self.say(f"job {request_id}: release failed: {exc}")


async def agent(args: argparse.Namespace, launcher: Launcher | None = None) -> int:
    loop = asyncio.get_running_loop()
    async with AsyncRespool(args.url, args.token, queue_lease=None) as rp:
        me = Agent(rp, args, launcher or LocalLauncher())
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, me.stop, sig)
        try:
            return await me.serve()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None, prog: str = "respool agent") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("--token (or RESPOOL_TOKEN) is required: a token of role agent")
    if not 1 <= args.interval <= 300:
        parser.error("--interval: 1 to 300 seconds")
    if args.node and args.pool:
        parser.error("--node and --pool: give one (a node's pool is known)")
    if args.detect and not args.register:
        parser.error("--detect goes with --register (it finds what the node is registered with)")
    if args.register and args.pool:
        parser.error("--register registers a node: give --node NAME, not --pool")
    if (args.sharing or args.device_memory or args.reserved_memory) and not args.register:
        parser.error("--sharing, --device-memory and --reserved-memory go with --register")
    try:
        args.shared = {"sharing": sharing_map(args.sharing)}
    except ValueError as exc:
        parser.error(f"--sharing: {exc}")
    for option, name, least in (
        ("--device-memory", "device_memory_mb", 1),
        ("--reserved-memory", "reserved_memory_mb", 0),
    ):
        try:
            args.shared[name] = memory_map(getattr(args, name.removesuffix("_mb")), least)
        except ValueError as exc:
            parser.error(f"{option}: {exc}")
    if args.register and not args.node:
        try:
            args.node = host_node_name()
        except ValueError as exc:
            parser.error(f"--node: {exc}")
    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        return asyncio.run(agent(args))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m respool_client.agent"))
