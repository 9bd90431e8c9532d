"""``request create --wait``: long-poll a queued request with a live spinner on stderr."""

from __future__ import annotations

import time

from respool_client.wire import Request

from cli.api import Api
from cli.output import console
from cli.tables import fmt_eta

__all__ = ["POLL", "wait_until_not_queued"]

# Each long-poll answers at the first status change, or after POLL seconds so the spinner
# can show the new queue position (a position change does not bump the version).
POLL = 1.0


def _status_line(req: Request, waited: float, limit: float) -> str:
    where = req.pool or "its candidate pools"
    position = f"#{req.queue_position} in the queue of {where}" if req.queue_position else where
    eta = f", ETA {fmt_eta(req.eta)}" if req.eta is not None else ""
    return f"queued {position}: {req.message or 'waiting'}{eta} [{waited:.0f}s/{limit:g}s]"


def wait_until_not_queued(api: Api, req: Request, seconds: float) -> Request:
    """Re-read ``req`` until it leaves ``queued`` or ``seconds`` pass; the latest state."""
    start = time.monotonic()
    deadline = start + seconds
    with console(stderr=True).status(_status_line(req, 0, seconds)) as spinner:
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
    return req
