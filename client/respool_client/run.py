"""``respool run [options] -- CMD [ARGS...]``: run any command under an allocation
(``docs/client.md``, "respool run").

It waits for the grant, saying on stderr what it is doing from the moment it asks
(:mod:`respool_client._status`: queued with the position, the reason and the ETA; granted;
preempting; requeued; an API that does not answer, while the call is retried; on a terminal one
live line), heartbeating the queued request with a queue lease (``--queue-lease``) so that a
wrapper killed while waiting gives its place up. No call retries past ``--timeout``.

It runs CMD in a process group of its own (:mod:`respool_client._group`) with the grant's
variables in its environment (:func:`respool_client.grant.step_env`: ``RESPOOL_REQUEST_ID``,
``RESPOOL_POOL``, ``RESPOOL_ATTEMPT``, ``RESPOOL_RESOURCES``, and on a node ``RESPOOL_NODE``,
``RESPOOL_DEVICES``, ``CUDA_VISIBLE_DEVICES``, and for a slice of a shared GPU its variables;
rebuilt for every attempt, which may land elsewhere), heartbeats and long-polls the request
while CMD runs (holding a ``gpu_memory_mb`` slice, each heartbeat carries the GPU memory of
CMD's group: :mod:`respool_client.usage`), and:

* on ``preempting`` sends SIGTERM to CMD's group, and SIGKILL at the grace deadline (or
  ``--kill-after`` seconds after the SIGTERM);
* on ``preempted``, ``expired`` or ``cancelled`` (the units are gone), or when no heartbeat got
  through within the lease, sends SIGTERM, and SIGKILL ``--kill-after`` seconds later (default
  :data:`GONE_KILL_AFTER`);
* when CMD exits, stops what it left in its group the same way;
* on SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2 or SIGALRM sends SIGINT (for SIGINT) or
  SIGTERM to CMD's group, and SIGKILL ``--kill-after`` seconds later (a second signal: at once);
* releases the request only once no process of CMD's group is left; when a preempted request
  was requeued (``--max-retries``), waits for the grant again and runs CMD anew as the next
  attempt.

Exit status: CMD's own (128 + N when a signal N ended it), or one of :data:`EXIT_CODES`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import io
import json
import logging
import os
import re
import signal
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import NoReturn, TextIO, TypeVar

from msgspec import UNSET, UnsetType
from respool_client._async import AsyncRespool
from respool_client._hold import QUEUE_LEASE, Usage, await_grant, start_holding
from respool_client._status import Status
from respool_client.errors import (
    AllocationTimeout,
    ApiError,
    Preempted,
    Rejected,
    RespoolError,
    field_led,
)
from respool_client.grant import Grant, describe_slices
from respool_client.launcher import Launched, Launcher, LocalLauncher, OnOutput
from respool_client.pairs import (
    host_node_name,
    mebibytes,
    percent,
    raising,
    split_amount,
    split_pair,
)
from respool_client.usage import USAGE_KEY, measure
from respool_client.wire import GROUP_PATTERN, HOLDING, Request, ResourceSettings

__all__ = [
    "EXIT_CODES",
    "OPTION_OF_FIELD",
    "api_error_text",
    "build_parser",
    "here",
    "host_node_name",
    "main",
    "node_selector",
    "run",
]

EXIT_USAGE = 2
EXIT_API = 69  # the server could not be reached or refused the call (EX_UNAVAILABLE)
EXIT_REJECTED = 73  # the request was rejected (or cancelled while queued)
EXIT_TIMEOUT = 74  # not allocated within --timeout; the request was cancelled
EXIT_PREEMPTED = 75  # preempted (or expired) with no retries left (EX_TEMPFAIL: try again)
EXIT_CODES = {
    EXIT_USAGE: "bad options",
    EXIT_API: "the respool API could not be reached or refused the call",
    EXIT_REJECTED: "the request was rejected",
    EXIT_TIMEOUT: "not allocated within --timeout",
    EXIT_PREEMPTED: "preempted, no retries left",
}
# Seconds CMD gets after SIGTERM when its units are already gone (no grace deadline), when it
# exited leaving processes in its group, or when the wrapper got a signal.
GONE_KILL_AFTER = 10.0
# Seconds to read what is left in CMD's output pipes (on_output) once its group is gone.
DRAIN_AFTER = 2.0
# How an attempt that was requeued ended (its history), and how long to try to read it.
ENDED = frozenset({"preempted", "expired", "cancelled"})
ENDED_LOOKUP = 2.0
# Seconds after asking with no answer (nor failure) before the wrapper says it still waits.
FIRST_WORD = 1.0
# The signals that stop the wrapper (SIGINT is passed on as SIGINT, the others as SIGTERM).
STOP_SIGNALS = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
)


def build_parser(prog: str = "respool run") -> argparse.ArgumentParser:
    codes = "; ".join(f"{code}: {what}" for code, what in EXIT_CODES.items())
    parser = _Parser(
        prog=prog,
        description="Run CMD under a respool allocation: wait for the grant, run CMD with "
        "RESPOOL_REQUEST_ID/POOL/ATTEMPT/RESOURCES set (placed on a node: also RESPOOL_NODE, "
        "RESPOOL_DEVICES and CUDA_VISIBLE_DEVICES; a slice of a shared GPU: its one device, "
        "RESPOOL_GPU_MEMORY_MB/SHARE and the MPS limits, and CMD's GPU memory is reported with "
        "the heartbeats), stop it when preempted, release on exit.",
        epilog=f"Exit status: CMD's own, or {codes}.\n\nExamples:\n"
        f"  {prog} --subject orchestrator:prod --gpu 2 -- python train.py\n"
        f"  {prog} --subject team:vision --pool a100s --gpu 4 \\\n"
        "      --selector gpu-type=A100-80G --max-retries 2 -- python train.py",
        formatter_class=_HelpFormatter,
    )
    add_connection(parser, token_help="Bearer token (RESPOOL_TOKEN).")
    add = parser.add_argument
    add("--subject", "-s", default=os.environ.get("RESPOOL_SUBJECT"), metavar="SUBJECT",
        help="Who asks, e.g. orchestrator:prod (RESPOOL_SUBJECT).")  # fmt: skip
    add("--pool", metavar="POOL",
        help="Only this pool (default: every pool the subject has a policy on).")  # fmt: skip
    add("--gpu", type=_count, metavar="N", help="GPUs (gpu).")
    add("--cpu", type=_decimal, metavar="X", help="CPUs, e.g. 0.5 (mcpu = ceil(x*1000)).")
    add("--memory", metavar="SIZE", help="Memory, e.g. 8GB or 16GiB (memory_mb).")
    add("--gpu-memory", type=_gpu_memory, metavar="SIZE",
        help="A slice of one shared GPU with this much memory (gpu_memory_mb): 20GiB, "
        "512MiB or MiB as a number.")  # fmt: skip
    add("--gpu-share", type=_gpu_share, metavar="PERCENT",
        help="With --gpu-memory: this share of the GPU's compute, 1 to 100 "
        "(gpu_share).")  # fmt: skip
    add("--resource", "-r", action="append", default=[], type=_amount, metavar="KEY=N",
        help="Any key; repeat for more (tpu=2).")  # fmt: skip
    add("--non-preemptible", action="store_true", help="Never preempted; must fit reserved.")
    add("--max-retries", type=_count, default=0, metavar="N",
        help="Re-runs after a preemption (default 0).")  # fmt: skip
    add("--lease", type=_lease, default=UNSET, metavar="S|none",
        help="Lease seconds, or none for no lease (default: the server's).")  # fmt: skip
    add("--queue-lease", type=_positive_int, default=QUEUE_LEASE, metavar="S",
        help="While waiting, heartbeat so that the request loses its queue place this many "
        f"seconds after the wrapper died (default {QUEUE_LEASE}).")  # fmt: skip
    add("--timeout", type=_seconds, metavar="S",
        help="Give up waiting for the grant after this many seconds (also while the API does "
        "not answer: no call is retried past it).")  # fmt: skip
    add("--kill-after", type=_seconds, metavar="S",
        help="SIGKILL this long after SIGTERM (default: at the grace deadline).")  # fmt: skip
    add("--label", action="append", default=[], type=_label, metavar="KEY=VALUE",
        help="A label of the request; repeat for more.")  # fmt: skip
    add("--selector", action="append", default=[], type=_label, metavar="LABEL=VALUE",
        help="Only a node with this label (pools with nodes); repeat for more, all must match "
        "(gpu-type=A100-80G).")  # fmt: skip
    add("--node", metavar="NAME", help="Only this node (the selector node=NAME).")
    add("--group", type=_group, metavar="G",
        help="Preemption group: never preempts an allocation of the same group (e.g. the "
        "other steps of one pipeline run).")  # fmt: skip
    add("--here", action="store_true",
        help="Only the node this runs on: RESPOOL_NODE, else this machine's hostname in lower "
        "case.")  # fmt: skip
    add("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    return parser


def add_connection(parser: argparse.ArgumentParser, *, token_help: str) -> None:
    """``--url`` and ``--token``, defaulting to RESPOOL_URL and RESPOOL_TOKEN."""
    add = parser.add_argument
    add("--url", default=os.environ.get("RESPOOL_URL", "http://127.0.0.1:8080"), metavar="URL",
        help="API URL (RESPOOL_URL; default http://127.0.0.1:8080).")  # fmt: skip
    add("--token", default=os.environ.get("RESPOOL_TOKEN"), metavar="TOKEN", help=token_help)


class _HelpFormatter(argparse.HelpFormatter):
    """Prose wrapped to the terminal paragraph by paragraph; indented lines (the examples)
    kept as written, one command a line."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        for block in text.split("\n\n"):
            lines = block.splitlines()
            prose = [line for line in lines if not line.startswith(" ")]
            if len(prose) == len(lines):
                out.append(textwrap.fill(" ".join(lines), width, initial_indent=indent,
                                         subsequent_indent=indent))  # fmt: skip
            else:
                out.append("\n".join(indent + line for line in lines))
        return "\n\n".join(out)


def main(argv: Sequence[str] | None = None, prog: str = "respool run") -> int:
    """Parse ``argv`` (the options after ``run``) and run; returns the exit status.

    The wrapper's own output (usage errors, help, status lines) is best effort: a closed
    stdout or stderr (``respool run … | head -1``) never stops CMD nor the release."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _BestEffort.over(sys.stdout), _BestEffort.over(sys.stderr)
    # Python ignores SIGPIPE already; an embedding program may not have (CMD gets the default
    # disposition back when it is started).
    with contextlib.suppress(ValueError, OSError):  # ValueError: not the main thread
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        return _main(argv, prog)
    except SystemExit as exc:  # --help, a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    finally:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, _BestEffort):
                stream.close()
        sys.stdout, sys.stderr = saved


def _main(argv: Sequence[str] | None, prog: str) -> int:
    parser = build_parser(prog)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(_unknown_options(parser, unknown))
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        parser.error("no command to run: respool run [options] -- CMD [ARGS...]")
    if not args.subject:
        parser.error("--subject (or RESPOOL_SUBJECT) is required")
    if args.gpu_share is not None and args.gpu_memory is None:
        parser.error("--gpu-share: a share is of a slice: give --gpu-memory too")
    if args.gpu is not None and args.gpu_memory is not None:
        parser.error("--gpu-memory: whole GPUs (--gpu) or one slice (--gpu-memory), not both")
    try:
        args.node_selector = node_selector(args.selector, args.node, args.here)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        return asyncio.run(run(args, cmd))
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (no usage block), exit status 2."""

    def error(self, message: str) -> NoReturn:
        # "argument --resource/-r: ..." -> "--resource: ..."
        message = re.sub(r"^argument ([^/:\s]+)(?:/[^:\s]+)*: ", r"\1: ", message)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _unknown_options(parser: argparse.ArgumentParser, unknown: list[str]) -> str:
    """``unknown option --gpus (did you mean --gpu?)`` for what the parser did not know."""
    known = [opt for action in parser._actions for opt in action.option_strings]
    words = []
    for arg in unknown:
        name = arg.partition("=")[0] if arg.startswith("--") else arg
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        words.append(name + (f" (did you mean {close[0]}?)" if close else ""))
    if not any(arg.startswith("-") for arg in unknown):
        return f"unexpected arguments: {' '.join(unknown)} (CMD goes after --)"
    return ("unknown option " if len(words) == 1 else "unknown options ") + ", ".join(words)


class _BestEffort(io.TextIOBase):
    """A text stream for the wrapper's own messages that never fails: written straight to a
    duplicate of the original descriptor (nothing is buffered, so nothing is left to fail at
    exit); once a write fails (EPIPE: the reader is gone), the rest is dropped. CMD keeps the
    original descriptors, and with them the closed pipe's usual SIGPIPE."""

    def __init__(self, fd: int, tty: bool) -> None:
        super().__init__()
        self._fd: int | None = fd
        self._tty = tty

    @classmethod
    def over(cls, stream: TextIO) -> TextIO:
        """``stream`` made best effort (as is, when it has no descriptor: a test's capture)."""
        try:
            fd = os.dup(stream.fileno())
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            return stream
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
        tty = False
        with contextlib.suppress(OSError, ValueError):
            tty = stream.isatty()
        best: TextIO = cls(fd, tty)  # type: ignore[assignment]
        return best

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self._tty

    def fileno(self) -> int:
        if self._fd is None:
            raise io.UnsupportedOperation("the stream was closed by its reader")
        return self._fd

    def write(self, text: str) -> int:
        data = text.encode(errors="replace")
        while data and self._fd is not None:
            try:
                data = data[os.write(self._fd, data) :]
            except InterruptedError:
                continue
            except OSError:  # EPIPE, EIO (the terminal went away), ENOSPC, ...
                self._drop()
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._drop()
        super().close()

    def _drop(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


class _Runner:
    """Runs CMD under a grant: ``respool run``'s whole life (:meth:`run`), and one attempt of a
    job for ``respool agent`` (:meth:`_one_attempt`), started through ``launcher``
    (:mod:`respool_client.launcher`). ``base_env`` (default: ours), then ``extra_env``, then the
    grant's variables make CMD's environment; ``on_output``: CMD's output goes there instead of
    our stdout and stderr."""

    def __init__(
        self,
        rp: AsyncRespool,
        args: argparse.Namespace,
        cmd: list[str],
        *,
        launcher: Launcher | None = None,
        status: Status | None = None,
        base_env: dict[str, str] | None = None,
        extra_env: dict[str, str] | None = None,
        workdir: str | None = None,
        on_output: OnOutput | None = None,
    ) -> None:
        self.rp = rp
        self.args = args
        self.cmd = cmd
        self.launcher = launcher or LocalLauncher()
        self.base_env = base_env
        self.extra_env = extra_env or {}
        self.workdir = workdir
        self.on_output = on_output
        if status is None:
            status = Status(sys.stderr)
            rp.listener = status
        self.status = status
        self.group: Launched | None = None
        self.stop_signal: int | None = None
        self.stopping = asyncio.Event()
        self.poked = asyncio.Event()  # kill_at changed: the attempt loop re-reads it
        self.term_sent = False
        self.kill_at: float | None = None  # monotonic time of the scheduled SIGKILL
        self.preempting = False  # this attempt's units are being (or were) taken away

    # --- signals to CMD's process group ---

    def _signal(self, sig: int) -> None:
        if self.group is not None:
            self.group.signal(sig)

    def _kill_after(self) -> float:
        return GONE_KILL_AFTER if self.args.kill_after is None else float(self.args.kill_after)

    def _terminate(self, kill_in: float, why: str, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` to CMD's group now (once), SIGKILL it ``kill_in`` seconds from now at
        the latest."""
        if self.group is None:
            return
        if not self.term_sent:
            self.term_sent = True
            name = signal.Signals(sig).name
            self.status.say(f"{why}: {name} to CMD's group, SIGKILL in {max(kill_in, 0):.1f} s")
            self._signal(sig)
        at = time.monotonic() + max(kill_in, 0.0)
        if self.kill_at is None or at < self.kill_at:
            self.kill_at = at
            self.poked.set()

    def _kill_due(self) -> bool:
        return self.kill_at is not None and time.monotonic() >= self.kill_at

    def _on_wrapper_signal(self, sig: int) -> None:
        if self.stop_signal is not None:  # a second signal: no more grace
            self.kill_at = time.monotonic()
            self.poked.set()
            return
        self.stop_signal = sig
        self.stopping.set()
        forward = signal.SIGINT if sig == signal.SIGINT else signal.SIGTERM
        self._terminate(self._kill_after(), f"got {signal.Signals(sig).name}", forward)

    # --- the request ---

    def _settings(self) -> ResourceSettings | None:
        a = self.args
        if a.gpu is None and a.cpu is None and a.memory is None:
            return None
        return ResourceSettings(gpu_count=a.gpu, cpu_count=a.cpu, memory=a.memory)

    async def _wait_for_grant(self, state: Request, sent: float, started: float) -> Grant:
        deadline = None if self.args.timeout is None else started + self.args.timeout
        waiter = asyncio.create_task(
            await_grant(
                self.rp,
                state,
                sent,
                started,
                deadline,
                self.args.queue_lease,
                on_wait=self.status.waiting,
            )
        )
        stop = asyncio.create_task(self.stopping.wait())
        await asyncio.wait({waiter, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():  # the wrapper got a stop signal: await_grant cancels the request
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
            raise _Stopped
        stop.cancel()
        return waiter.result()

    def _kill_delay(self, state: Request) -> float:
        """Seconds from now to SIGKILL after a ``preempting``: ``--kill-after``, else until the
        grace deadline."""
        if self.args.kill_after is not None:
            return float(self.args.kill_after)
        if state.preempt_deadline is None:
            return GONE_KILL_AFTER
        return (state.preempt_deadline - datetime.now(UTC)).total_seconds()

    async def _one_attempt(self, grant: Grant, waited: float) -> tuple[int, Request | None]:
        """Run CMD under ``grant`` (got after ``waited`` seconds) until no process of its group
        is left; CMD's exit status and the last state seen of the request."""
        # This attempt's grant, not the first one's: a requeued attempt may run elsewhere.
        base = os.environ if self.base_env is None else self.base_env
        env = {**base, **self.extra_env, **grant.env()}
        self.term_sent, self.kill_at, self.preempting = False, None, False
        where = ""
        if grant.placement is not None:
            devices = " ".join(
                f"{key}={','.join(ids)}" for key, ids in sorted(grant.placement.devices.items())
            )
            where = f" on node {grant.placement.node}" + (f" ({devices})" if devices else "")
        self.status.say(
            f"request {grant.request_id} attempt {grant.attempt}: allocated in {grant.pool}"
            f"{where} after {waited:.1f} s: {json.dumps(grant.resources, sort_keys=True)}; "
            f"running {self.cmd[0]}"
        )
        if grant.placement is not None:
            for line in describe_slices(grant.placement):
                self.status.say(f"request {grant.request_id}: {line}")
        self.status.holding(lambda: _lease_left(grant))
        try:
            group = await self.launcher.start(self.cmd, env, self.workdir, self.on_output)
        except OSError as exc:
            self.status.say(f"cannot run {self.cmd[0]}: {exc}")
            return 127, None
        self.group = group
        changes: asyncio.Queue[Request] = asyncio.Queue()
        hold = start_holding(
            self.rp, grant, None, None, on_change=changes.put_nowait, usage=_usage(grant, group)
        )
        if self.stop_signal is not None:  # a signal arrived while CMD was starting
            forward = signal.SIGINT if self.stop_signal == signal.SIGINT else signal.SIGTERM
            self._terminate(self._kill_after(), "stopping", forward)
        try:
            last = await self._until_group_gone(grant, group, changes)
            await group.drained(DRAIN_AFTER)  # the output still in the pipes
        finally:
            hold.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await hold
            group.close()
            self.group = None
        code = group.returncode
        assert code is not None
        while not changes.empty():
            last = changes.get_nowait()
        return (128 - code if code < 0 else code), last

    async def _until_group_gone(
        self, grant: Grant, group: Launched, changes: asyncio.Queue[Request]
    ) -> Request | None:
        """React to the request's changes until CMD exits, then stop what it left in its group
        (SIGTERM, SIGKILL at the deadline) and return once no process of the group is left."""
        last: Request | None = None
        exited = asyncio.create_task(group.wait())
        leader_gone = False
        while True:
            if exited.done() and not leader_gone:
                leader_gone = True
                if group.alive():
                    self._terminate(self._kill_after(), "CMD exited leaving processes behind")
            if leader_gone and not group.alive():
                return last
            if grant.lease_lapsed and not self.term_sent:
                self.preempting = True
                self._terminate(self._kill_after(), "no heartbeat got through within the lease")
            waits: list[float] = []
            if self.kill_at is not None:
                waits.append(max(0.0, self.kill_at - time.monotonic()))
            if leader_gone:
                waits.append(0.05)  # poll the rest of the group
            elif grant._valid_until is not None and not self.term_sent:
                waits.append(max(0.0, grant._valid_until - time.monotonic()) + 0.01)
            got = asyncio.create_task(changes.get())
            poke = asyncio.create_task(self.poked.wait())
            pending = {got, poke} if leader_gone else {got, poke, exited}
            await asyncio.wait(
                pending, timeout=min(waits, default=None), return_when="FIRST_COMPLETED"
            )
            self.poked.clear()
            poke.cancel()
            if got.done():
                last = got.result()
                self._react(grant, last)
            else:
                got.cancel()
            if self._kill_due():
                if group.alive():
                    self.status.say("grace over: SIGKILL to CMD's group")
                self._signal(signal.SIGKILL)
                self.kill_at = None

    def _react(self, grant: Grant, state: Request) -> None:
        if state.status != "released":
            self.preempting = True
        this = f"request {grant.request_id} attempt {grant.attempt}"
        if state.attempt == grant.attempt and state.status == "preempting":
            self._terminate(self._kill_delay(state), f"{this}: preempting ({state.reason})")
        elif state.attempt != grant.attempt and state.status != "released":
            self._terminate(self._kill_after(), f"{this}: preempted")
        elif state.status not in HOLDING and state.status != "released":
            self._terminate(self._kill_after(), f"{this}: {state.status} ({state.reason})")

    async def _how_it_ended(self, grant: Grant) -> str:
        """How ``grant``'s attempt ended, from the request's history: ``preempted (reclaim)``
        (the state after a requeue says only ``retry``)."""
        path = f"/v1/requests/{grant.request_id}/events"
        with contextlib.suppress(RespoolError, TypeError, KeyError):
            events = await self.rp.call("GET", path, retry_for=ENDED_LOOKUP)
            for event in reversed(events):
                if event["attempt"] == grant.attempt and event["to"] in ENDED:
                    return f"{event['to']} ({event['reason']})"
        if grant.reason in (None, "retry"):
            return "preempted"
        return f"preempted ({grant.reason})"

    async def _release(self, grant: Grant, *, drop: bool = True) -> Request | None:
        """Release ``grant``'s attempt; the request's state after it (None: unknown).

        409 means it was requeued under a new attempt meanwhile: with ``drop``, that is
        released too (we are done with it), else its state is returned."""
        try:
            return await self.rp.release(grant.request_id, grant.attempt)
        except ApiError as exc:
            if exc.status_code == 409:
                if drop:
                    with contextlib.suppress(RespoolError):
                        return await self.rp.release(grant.request_id)
                    return None
                with contextlib.suppress(RespoolError):
                    return await self.rp.get_request(grant.request_id)
            elif exc.status_code != 404:
                self.status.say(f"could not release request {grant.request_id}: {exc}")
        except RespoolError as exc:
            self.status.say(f"could not release request {grant.request_id}: {exc}")
        return None

    def _begin_wait(self) -> float:
        """A wait for a grant begins now: no call retries past ``--timeout`` from now (the
        grant cannot come by then anyway); the start time."""
        started = time.monotonic()
        self.status.asking()
        timeout = self.args.timeout
        self.rp.retry_until = None if timeout is None else started + timeout
        return started

    async def _create(self) -> Request:
        """Create the request; says so when the API has not answered within
        :data:`FIRST_WORD` seconds (failed tries are reported as they happen)."""
        a = self.args
        # No ``wait`` on the create: its answer (queued, with the position, the reason and the
        # ETA) is shown at once, and the queue lease is set as soon as the request exists.
        create = asyncio.create_task(
            self.rp.create_request(
                a.subject,
                pool=a.pool,
                resources=slice_resources(a) or None,
                settings=self._settings(),
                preemptible=not a.non_preemptible,
                max_retries=a.max_retries,
                lease_seconds=a.lease,
                labels=dict(a.label) or None,
                node_selector=getattr(a, "node_selector", None) or None,
                preemption_group=getattr(a, "group", None) or None,
            )
        )
        done, _ = await asyncio.wait({create}, timeout=FIRST_WORD)
        if not done:
            self.status.no_answer_yet(self.rp.url)
        return await create

    async def run(self) -> int:
        started = sent = self._begin_wait()
        try:
            state = await self._create()
            while True:
                grant = await self._wait_for_grant(state, sent, started)
                self.rp.retry_until = None
                try:
                    code, last = await self._one_attempt(grant, time.monotonic() - started)
                except BaseException:  # a bug, or cancelled: give the units back all the same
                    await asyncio.shield(self._release(grant))
                    raise
                if self.stop_signal is not None:
                    await self._release(grant)
                    self.status.say(f"stopped by signal {self.stop_signal}; released")
                    return 128 + self.stop_signal
                held = last is None or (last.attempt == grant.attempt and last.status in HOLDING)
                if held and not self.preempting:
                    await self._release(grant)  # CMD ended on its own: done
                    self.status.say(f"CMD exited with {code}; released {grant.request_id}")
                    return code
                # Taken away. Still preempting: our release ends it (and requeues it when it has
                # retries left); else the server already moved it on.
                after = await self._release(grant, drop=False) if held else last
                if after is None:
                    return EXIT_PREEMPTED
                if after.attempt != grant.attempt and not after.terminal:
                    self.status.say(
                        f"request {grant.request_id} attempt {grant.attempt}: "
                        f"{await self._how_it_ended(grant)}; requeued as attempt {after.attempt} "
                        f"(retry {after.attempt - 1} of {after.max_retries})"
                    )
                    started = sent = self._begin_wait()
                    state = after
                    continue
                if after.status == "released":
                    return code
                self.status.say(
                    f"request {grant.request_id} attempt {grant.attempt}: {after.status} "
                    f"({after.reason}): no retries left"
                )
                return EXIT_PREEMPTED
        except _Stopped:
            self.status.say(f"got signal {self.stop_signal} while waiting: request cancelled")
            return 128 + (self.stop_signal or signal.SIGTERM)
        except Rejected as exc:
            self.status.say(f"rejected: {exc.reason}: {exc.message}")
            return EXIT_REJECTED
        except AllocationTimeout as exc:
            self.status.say(f"not allocated within --timeout: {exc}")
            return EXIT_TIMEOUT
        except Preempted as exc:
            self.status.say(f"preempted before it could run: {exc.reason}: {exc.message}")
            return EXIT_PREEMPTED
        except ApiError as exc:
            self.status.say(f"error: {api_error_text(exc)}")
            # A value of an option the server refused as malformed is a usage error.
            malformed = exc.status_code in (400, 422) and _option_of(exc.field) is not None
            return EXIT_USAGE if malformed else EXIT_API
        except RespoolError as exc:
            self.status.say(f"error: {exc}")
            return EXIT_API


def _usage(grant: Grant, group: Launched) -> Usage | None:
    """What to measure for the heartbeats: a grant holding a slice of a GPU
    (``gpu_memory_mb``) of a command whose process group is known reports that group's GPU
    memory (:mod:`respool_client.usage`); else nothing."""
    pgid = getattr(group, "pgid", None)
    if USAGE_KEY not in grant.resources or not isinstance(pgid, int):
        return None

    async def measured() -> dict[str, int] | None:
        return await measure(pgid)

    return measured


def _lease_left(grant: Grant) -> float | None:
    """Seconds until ``grant``'s lease ends unless a heartbeat renews it (None: no lease)."""
    if grant._valid_until is None:
        return None
    return max(0.0, grant._valid_until - time.monotonic())


class _Stopped(Exception):
    """The wrapper was told to stop (a stop signal) before CMD ran."""


async def run(args: argparse.Namespace, cmd: list[str]) -> int:
    """Run ``cmd`` under an allocation described by parsed ``args``; returns the exit status."""
    loop = asyncio.get_running_loop()
    async with AsyncRespool(args.url, args.token, queue_lease=args.queue_lease) as rp:
        runner = _Runner(rp, args, cmd)
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, runner._on_wrapper_signal, sig)
        ticker = asyncio.create_task(runner.status.tick()) if runner.status.live else None
        said = _StatusLog(runner.status)
        client_log = logging.getLogger("respool.client")
        client_log.addHandler(said)
        try:
            return await runner.run()
        finally:
            client_log.removeHandler(said)
            if ticker is not None:
                ticker.cancel()
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)


class _StatusLog(logging.Handler):
    """The client's warnings (a failed heartbeat, say) as status lines; none while a call is
    being retried (its status line already says what fails)."""

    def __init__(self, status: Status) -> None:
        super().__init__(logging.WARNING)
        self.status = status

    def emit(self, record: logging.LogRecord) -> None:
        if not self.status.troubled:
            self.status.say(record.getMessage())


# --- errors, as the user typed the options ------------------------------------------------

# The option that sets each field of the request body (a field ``resources.gpu`` is ``--resource``
# with ``gpu``).
OPTION_OF_FIELD = {
    "subject": "--subject",
    "pool": "--pool",
    "settings.gpu_count": "--gpu",
    "settings.cpu_count": "--cpu",
    "settings.memory": "--memory",
    "resources": "--resource",
    "resources.gpu_memory_mb": "--gpu-memory",
    "resources.gpu_share": "--gpu-share",
    "preemptible": "--non-preemptible",
    "max_retries": "--max-retries",
    "lease_seconds": "--lease",
    "labels": "--label",
    "node_selector": "--selector",
    "preemption_group": "--group",
}


def api_error_text(exc: ApiError) -> str:
    """The API's refusal in one line, the field named as the option the user typed:
    ``settings.memory "8G" is not …`` → ``--memory: "8G" is not …``; ``pool 'boxx' not found``
    → ``--pool: pool 'boxx' not found`` (the word naming a kind of thing is kept)."""
    detail = " ".join((exc.detail or f"HTTP {exc.status_code}").split())
    if exc.status_code == 401:
        detail += " (pass --token or set RESPOOL_TOKEN)"
    field = exc.field
    found = _option_of(field)
    if field is None:
        return detail
    if found is None:
        return f"{detail} ({field})"
    option, rest = found
    return field_led(detail, field, option, rest) or f"{option}: {detail}"


def _option_of(field: str | None) -> tuple[str, str] | None:
    """(option, rest of the field) of the option that sets ``field``: ``resources.gpu`` →
    (``--resource``, ``gpu``), ``settings.memory`` → (``--memory``, ``""``); None: no option."""
    if not field:
        return None
    if field in OPTION_OF_FIELD:
        return OPTION_OF_FIELD[field], ""
    head, _, rest = field.partition(".")
    if head in OPTION_OF_FIELD:
        return OPTION_OF_FIELD[head], rest
    return None


# --- where to run ----------------------------------------------------------------------------


def here(environ: dict[str, str] | None = None) -> str:
    """The node ``--here`` means: ``RESPOOL_NODE`` when set (not empty), else
    :func:`respool_client.pairs.host_node_name`."""
    env = os.environ if environ is None else environ
    return env.get("RESPOOL_NODE", "").strip() or host_node_name()


def node_selector(
    pairs: Sequence[tuple[str, str]], node: str | None, at_here: bool
) -> dict[str, str]:
    """The request's ``node_selector`` from ``--selector`` pairs, ``--node`` and ``--here``
    (both name the built-in label ``node``); ``ValueError`` when they disagree."""
    selector = dict(pairs)
    if node is not None and at_here:
        raise ValueError("--node and --here both name the node: give one")
    named = here() if at_here else node
    if named is not None:
        given = selector.get("node")
        if given is not None and given != named:
            option = "--here" if at_here else "--node"
            raise ValueError(f"--selector node={given} and {option} ({named}) disagree")
        selector["node"] = named
    return selector


# --- option types ----------------------------------------------------------------------------

_Number = TypeVar("_Number", float, Decimal)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def _finite_non_negative(text: str, kind: Callable[[str], _Number], what: str) -> _Number:
    try:
        value = kind(text)
    except (ValueError, InvalidOperation):
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if not Decimal(value).is_finite() or value < 0:  # Decimal(nan or inf) is not finite
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0: {text!r}")
    return value


def _seconds(text: str) -> float:
    return _finite_non_negative(text, float, "a number of seconds")


def _decimal(text: str) -> Decimal:
    return _finite_non_negative(text, Decimal, "a number")


_gpu_memory = raising(mebibytes, argparse.ArgumentTypeError)
_gpu_share = raising(percent, argparse.ArgumentTypeError)


def slice_resources(args: argparse.Namespace) -> dict[str, int]:
    """The request's resources: ``--resource`` pairs, and ``--gpu-memory`` / ``--gpu-share`` as
    ``gpu_memory_mb`` / ``gpu_share`` (docs/placement.md, "Sharing a GPU")."""
    out = dict(args.resource)
    for option, key in (("gpu_memory", "gpu_memory_mb"), ("gpu_share", "gpu_share")):
        value = getattr(args, option, None)
        if value is not None:
            out[key] = value
    return out


def _amount(text: str) -> tuple[str, int]:
    try:
        return split_amount(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _label(text: str) -> tuple[str, str]:
    try:
        return split_pair(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _group(text: str) -> str:
    """``--group``: 1 to 128 printable characters."""
    if not re.fullmatch(GROUP_PATTERN, text):
        raise argparse.ArgumentTypeError(f"1 to 128 printable characters: {text!r}")
    return text


def _lease(text: str) -> int | None | UnsetType:
    """``--lease``: seconds (>= 1), or ``none``: no lease."""
    if text.strip().lower() == "none":
        return None
    return _positive_int(text)


if __name__ == "__main__":
    sys.exit(main(prog="python -m respool_client.run"))
