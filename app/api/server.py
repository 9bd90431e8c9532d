"""uvicorn for the API: SIGTERM/SIGINT also answer every open long-poll at once; slow clients
are timed out and connections are capped (docs/ops.md "Limits").

* :func:`guarded_protocol`: uvicorn's httptools protocol (the C parser: less CPU per request
  than the pure-Python h11) plus a header timeout (from a connection's first byte, or a
  request's, to the end of its headers; a connection that sends nothing is closed after it too)
  and a body timeout (from the end of the headers to the end of the body), and a cap on open
  connections (a connection above it is closed at once, so file descriptors stay bounded). No
  timer runs while an answer is being made. Idle keep-alive connections are closed by uvicorn's
  ``timeout_keep_alive`` (:data:`KEEP_ALIVE_TIMEOUT`).
* :class:`CoalescingTransport`: an answer's head and body leave in one ``send()`` (docs/api.md,
  "One write per answer").
* :func:`raise_nofile_limit`: the soft ``RLIMIT_NOFILE`` raised to the hard one at start.
* :class:`RateLimitedLog`: one "out of system resource" line per interval, not one per accept.
* :func:`uvicorn_config`: the ``uvicorn.Config`` ``respool serve`` runs with.
* :func:`serve_workers`: ``respool serve --workers N``, N API processes on one listening socket
  bound by the parent (docs/ops.md, "Workers").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import socket
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn
from litestar import Litestar
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.notify import Notifier
from app.settings import Settings

__all__ = [
    "ApiServer",
    "CoalescingTransport",
    "RateLimitedLog",
    "guarded_protocol",
    "raise_nofile_limit",
    "bind_listener",
    "serve_workers",
    "uvicorn_config",
]

log = logging.getLogger("respool.api")

# File descriptors kept for everything but client connections (database pool, LISTEN, logs).
FD_RESERVE = 64

# Seconds an idle keep-alive connection stays open. Longer than the idle expiry of httpx's pool
# (5 s, what respool_client uses), so that the client always drops an idle connection first:
# with equal timeouts a client reusing a connection the server is closing at that moment loses
# its request (the connection is reset under it; docs/ops.md, "Limits").
KEEP_ALIVE_TIMEOUT = 20


# Bytes held back at most before they are written at once (a streamed body is not held whole).
COALESCE_LIMIT = 64 * 1024

# Bytes of a request's line and headers received, still incomplete, above which the request is
# refused (400, connection closed): h11's limit (uvicorn's h11_max_incomplete_event_size), kept
# with httptools, which has none.
MAX_INCOMPLETE_HEAD = 16 * 1024


class CoalescingTransport:
    """A transport whose writes are held until the answer is complete or the loop turns.

    uvicorn writes an answer's head and its body with two ``write()`` calls, i.e. two
    ``send()`` system calls when the socket's buffer is empty. Here they are joined: the bytes
    are written by :meth:`flush` when the protocol completes an answer, on ``close()``, past
    :data:`COALESCE_LIMIT` bytes, or at the latest on the next loop iteration (``call_soon``),
    so the head of a streamed answer whose body comes later still leaves at once. Everything
    else is the wrapped transport's.
    """

    __slots__ = ("_transport", "_loop", "_held", "_size", "_scheduled")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def write(self, data: bytes) -> None:
        if not data:
            return
        self._held.append(data)
        self._size += len(data)
        if self._size >= COALESCE_LIMIT:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        """Write what is held, in one ``write()``."""
        if not self._held:
            return
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held.clear()
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held.clear()
        self._size = 0
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._size + self._transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header/body timeouts and a connection cap (class
    attributes set by :func:`guarded_protocol`).

    The parser's callbacks record where the request being read is (``_reading``: ``"headers"``
    from its first byte, ``"body"`` from the end of its headers, ``None`` once it is whole); the
    timer follows after each ``data_received`` and each completed answer, so a request whose
    bytes come in one read arms no timer at all.

    As with h11: an incomplete head above :data:`MAX_INCOMPLETE_HEAD` bytes is refused (400),
    and the head of a request pipelined behind one being answered waits unread (reading paused
    until the answer is complete), so neither memory nor time is unbounded.
    """

    header_timeout = 10.0
    body_timeout = 30.0
    max_connections = 20_000
    _phase: str | None = None  # what the timer is armed for
    _reading: str | None = None  # where the parser is in the request being read
    _head_bytes = 0  # bytes of the incomplete head counted so far
    _ended = False  # a request ended in the bytes being parsed
    _timer: asyncio.TimerHandle | None = None
    _coalescer: CoalescingTransport | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Every write of the protocol and of its request cycles goes through the coalescer
        # (flow control and addresses keep the socket's transport).
        self._coalescer = CoalescingTransport(transport, self.loop)
        self.transport = self._coalescer  # type: ignore[assignment]
        if len(self.connections) > self.max_connections:
            _refused_log.emit(
                "connection refused: %d open connections (RESPOOL_MAX_CONNECTIONS=%d)",
                len(self.connections),
                self.max_connections,
            )
            transport.abort()
            return
        self._arm("headers")  # a connection that never sends a request is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._arm(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._ended = False
        super().data_received(data)
        self._follow(len(data))

    # Parser callbacks (called from data_received, while httptools parses).
    def on_message_begin(self) -> None:
        self._reading = "headers"
        self._head_bytes = 0
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._reading = "body"
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._reading = None
        self._ended = True
        super().on_message_complete()

    def on_response_complete(self) -> None:
        # The answer is complete: its head and body leave now, in one write.
        if self._coalescer is not None:
            self._coalescer.flush()
        super().on_response_complete()
        self._follow(0)

    def _follow(self, received: int) -> None:
        """Arm the timer for the phase the peer is in: headers, body, or none (answering, or an
        idle keep-alive connection); ``received``: the bytes just parsed (0 after an answer)."""
        if self.transport is None or self.transport.is_closing():
            return
        cycle = self.cycle
        # An earlier request is being answered: a pipelined request waits without a timer
        # (its own starts once the answer is complete).
        answering = cycle is not None and not cycle.response_complete
        reading = self._reading
        if reading == "headers":
            if answering:
                self._arm(None)
                if received:
                    self.flow.pause_reading()  # on_response_complete resumes it
                return
            # The bytes of a read in which a request ended are not counted (the head began in
            # it, after that request): at most one read below the count.
            if received and not self._ended:
                self._head_bytes += received
                if self._head_bytes > MAX_INCOMPLETE_HEAD:
                    msg = "Invalid HTTP request received."  # as uvicorn's h11 protocol says it
                    self.logger.warning(msg)
                    self._arm(None)
                    self.send_400_response(msg)
                    return
            self._arm("headers")
        elif reading == "body":
            # This request's cycle is queued behind an earlier one while the pipeline holds it.
            self._arm(None if self.pipeline else "body")
        elif answering:
            self._arm(None)
        else:
            # Between requests, nothing being answered: uvicorn's keep-alive timer covers an
            # idle connection (armed when an answer completes); ours goes on from
            # connection_made until a request is whole, and starts again when bytes come that
            # leave no request to answer (blank lines before a request, which httptools skips;
            # data_received has stopped the keep-alive timer by then).
            self._arm("headers" if received or self._phase == "headers" else None)

    def _arm(self, phase: str | None) -> None:
        if phase == self._phase:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = phase
        if phase is not None:
            delay = self.header_timeout if phase == "headers" else self.body_timeout
            self._timer = self.loop.call_later(delay, self._timed_out, phase)

    def _timed_out(self, phase: str) -> None:
        self._timer = None
        if self.transport is not None and not self.transport.is_closing():
            log.debug("closing a connection: request %s not received in time", phase)
            self.transport.abort()


def guarded_protocol(
    *, header_timeout: float, body_timeout: float, max_connections: int
) -> type[GuardedHttpToolsProtocol]:
    """A :class:`GuardedHttpToolsProtocol` subclass with these limits (uvicorn's ``http=``)."""
    return type(
        "RespoolHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
            "max_connections": max_connections,
        },
    )


def raise_nofile_limit(target: int = 65536) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` towards ``min(hard, target)``; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class RateLimitedLog(logging.Filter):
    """A filter letting through one matching record per ``interval`` seconds (with a count of
    those dropped); other records pass. On ``asyncio``'s logger it stops the accept loop's
    "Too many open files" flood."""

    MARKERS = ("out of system resource", "Too many open files", "connection refused:")

    def __init__(self, interval: float = 10.0) -> None:
        super().__init__()
        self.interval = interval
        self._last = float("-inf")
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += str(record.exc_info[1])
        if not any(m in text for m in self.MARKERS):
            return True
        now = time.monotonic()
        if now - self._last < self.interval:
            self.dropped += 1
            return False
        self._last = now
        if self.dropped:
            record.msg = f"{record.msg} ({self.dropped} similar messages suppressed)"
            self.dropped = 0
        return True

    def emit(self, msg: str, *args: Any) -> None:
        """Log ``msg`` as a warning on ``respool.api``, through this filter."""
        record = log.makeRecord(log.name, logging.WARNING, __file__, 0, msg, args, None)
        if self.filter(record):
            log.handle(record)


_refused_log = RateLimitedLog()


def uvicorn_config(app: Litestar, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """The uvicorn configuration of ``respool serve``: guarded httptools, limits from ``settings``.

    The connection cap is kept below the file-descriptor limit (raised first).
    """
    fds = raise_nofile_limit()
    max_connections = max(1, min(settings.max_connections, fds - FD_RESERVE))
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, RateLimitedLog) for f in asyncio_log.filters):
        asyncio_log.addFilter(RateLimitedLog())
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "http": guarded_protocol(
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            max_connections=max_connections,
        ),
        "ws": "none",
        "lifespan": "on",
        "timeout_keep_alive": KEEP_ALIVE_TIMEOUT,
        "timeout_graceful_shutdown": 5,
        "backlog": 1024,
        **overrides,
    }
    return uvicorn.Config(app, **options)


class ApiServer(uvicorn.Server):
    """uvicorn, plus: on SIGTERM/SIGINT answer every open long-poll at once (docs/api.md), so the
    graceful shutdown does not wait for waits to time out."""

    def __init__(self, config: uvicorn.Config, app: Litestar) -> None:
        super().__init__(config)
        self._app = app
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, except that a SIGTERM is not raised again after the graceful shutdown.

        Raised again with its default action, it would kill the process before the ``atexit``
        handlers run, and the embedded PostgreSQL (stopped by one of them) would be left running.
        The process exits normally (status 0) instead. SIGINT is still raised again.
        """
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals[:] = [
                    s for s in self._captured_signals if s != signal.SIGTERM
                ]

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        notifier: Notifier = self._app.state.notifier
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(notifier.begin_shutdown)


# --- respool serve --workers N (docs/ops.md, "Workers") -----------------------------------------

# A worker that ends sooner than this after its start failed to start: the service stops (exit 1)
# rather than restart it in a loop. One that ends later is restarted.
WORKER_MIN_UPTIME = 5.0
# How long the parent waits for its workers' graceful shutdown before it kills them.
WORKER_STOP_TIMEOUT = 30.0


def bind_listener(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket on ``host:port``, inheritable by the worker processes."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _exit_with_parent(server: uvicorn.Server, parent: int) -> None:
    """Stop ``server`` gracefully once the process that started this one is gone."""
    while not server.should_exit:
        if os.getppid() != parent:
            log.warning("the parent process ended: stopping this worker")
            server.handle_exit(signal.SIGTERM, None)
            return
        time.sleep(1.0)


def _run_worker(
    settings: Settings, dsn: str, sock: socket.socket, with_reconciler: bool, parent: int
) -> None:
    """One worker process: the API (and the reconciler if asked) on the inherited socket."""
    from app.api import create_app
    from app.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format)
    app = create_app(settings, database_url=dsn, with_reconciler=with_reconciler)
    config = uvicorn_config(app, settings, log_level=settings.log_level.lower(), log_config=None)
    server = ApiServer(config, app)
    threading.Thread(target=_exit_with_parent, args=(server, parent), daemon=True).start()
    server.run(sockets=[sock])


class _Stop:
    signal: int | None = None

    def __call__(self, sig: int, frame: FrameType | None) -> None:
        self.signal = sig


def serve_workers(
    settings: Settings, dsn: str, sock: socket.socket, *, workers: int, with_reconciler: bool
) -> int:
    """Run ``workers`` API processes sharing the listening socket ``sock``
    (:func:`bind_listener`; closed here); the first one also runs the reconciler when
    ``with_reconciler``.

    The database is the caller's (migrated, and the embedded server started, once). A worker
    that ends after :data:`WORKER_MIN_UPTIME` is restarted; one that ends sooner stops the
    service (exit status 1). SIGTERM or SIGINT stops every worker gracefully (their long-polls
    answered at once); the exit status is then 0 (SIGTERM) or 130 (SIGINT).
    """
    context = multiprocessing.get_context("spawn")
    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    procs: dict[int, multiprocessing.process.BaseProcess] = {}
    started: dict[int, float] = {}

    def start(index: int) -> None:
        proc = context.Process(
            target=_run_worker,
            args=(settings, dsn, sock, with_reconciler and index == 0, os.getpid()),
            name=f"respool-worker-{index}",
        )
        proc.start()
        procs[index] = proc
        started[index] = time.monotonic()

    status = 0
    try:
        for index in range(workers):
            start(index)
        while stop.signal is None:
            multiprocessing.connection.wait([p.sentinel for p in procs.values()], timeout=0.5)
            for index, proc in list(procs.items()):
                if proc.is_alive() or stop.signal is not None:
                    continue
                uptime = time.monotonic() - started[index]
                if uptime < WORKER_MIN_UPTIME:
                    log.error(
                        "worker %d (pid %s) exited %s %.1f s after its start: stopping",
                        index,
                        proc.pid,
                        proc.exitcode,
                        uptime,
                    )
                    status = 1
                    stop.signal = signal.SIGTERM
                    break
                log.warning(
                    "worker %d (pid %s) exited %s: restarting it", index, proc.pid, proc.exitcode
                )
                start(index)
    finally:
        for proc in procs.values():
            if proc.is_alive() and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + WORKER_STOP_TIMEOUT
        for proc in procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.error("worker pid %s did not stop in time: killed", proc.pid)
                proc.kill()
                proc.join()
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if status == 0 and stop.signal == signal.SIGINT:
        status = 130
    return status
