"""``request create --wait``: long-poll a queued request, saying on stderr how it waits: a live
spinner on a terminal; elsewhere (a pipe, a CI log) one line when it queues and one per change of
its position or reason, as ``respool run`` does."""

from __future__ import annotations

import time

from respool_client.wire import Request

from cli.api import Api
from cli.output import console, note
from cli.tables import fmt_eta

__all__ = ["POLL", "wait_until_not_queued"]

# Each long-poll answers at the first status change, or after POLL seconds so the spinner
# can show the new queue position (a position change does not bump the version).
POLL = 1.0


def _waiting(req: Request) -> str:
    where = req.pool or "its candidate pools"
    position = f"#{req.queue_position} in the queue of {where}" if req.queue_position else where
    eta = f", ETA {fmt_eta(req.eta)}" if req.eta is not None else ""
    return f"queued {position}: {req.message or 'waiting'}{eta}"


def _key(req: Request) -> tuple[int | None, str]:
    return req.queue_position, req.message


def _status_line(req: Request, waited: float, limit: float) -> str:
    return f"{_waiting(req)} [{waited:.0f}s/{limit:g}s]"


def wait_until_not_queued(api: Api, req: Request, seconds: float) -> Request:
    """Re-read ``req`` until it leaves ``queued`` or ``seconds`` pass; the latest state."""
    start = time.monotonic()
    deadline = start + seconds
    err = console(stderr=True)
    said = None  # off a terminal: the position and reason last printed (the ETA alone: no line)
    if not err.is_terminal:
        said = _key(req)
        note(f"request {req.id}: {_waiting(req)} (waiting up to {seconds:g}s)")
    with err.status(_status_line(req, 0, seconds)) as spinner:
        while req.status == "queued":
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            poll = min(remaining, POLL)
            req = api.call(
                "GET",
                f"/v1/requests/{req.id}",
                Request,
                params={"wait": f"{poll:.3f}", "version": req.version},
                timeout=poll + 30,
            )
            spinner.update(_status_line(req, time.monotonic() - start, seconds))
            if said is not None and req.status == "queued" and said != (now := _key(req)):
                said = now
                note(f"request {req.id}: {_waiting(req)}")
    return req
