"""``@allocated(...)``: run a Python step (sync or async) under an allocation.

```python
@allocated(subject="orchestrator:prod", settings=ResourceSettings(gpu_count=2),
           node_selector={"gpu-class": "a100"}, preemption_group=run_id)
def train(data, grant):          # ``grant`` is passed when the function takes that parameter
    os.environ.update(grant.env())   # CUDA_VISIBLE_DEVICES: the GPUs placed for this call
    ...
```

``preemption_group``: calls of one group (e.g. the steps of one pipeline run) never preempt
each other. The allocation is held for the call (heartbeats and the watch of the request run in the
background) and released when it returns or raises. ``on_preempted(grant)`` is called once when
the units are being taken away; ``grant.deadline`` says when they will be taken by force.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any, TypeVar, cast

from respool_client._async import AsyncRespool
from respool_client._sync import Respool

__all__ = ["allocated"]

F = TypeVar("F", bound=Callable[..., Any])


def allocated(
    *,
    subject: str,
    url: str | None = None,
    token: str | None = None,
    **allocate: Any,
) -> Callable[[F], F]:
    """Decorate a function to run under ``allocate(subject, **allocate)``; ``url``/``token``
    default to ``RESPOOL_URL`` (else ``http://127.0.0.1:8080``) and ``RESPOOL_TOKEN``."""

    def endpoint() -> tuple[str, str | None]:
        return (
            url or os.environ.get("RESPOOL_URL", "http://127.0.0.1:8080"),
            token if token is not None else os.environ.get("RESPOOL_TOKEN"),
        )

    def decorate(fn: F) -> F:
        wants_grant = "grant" in inspect.signature(fn).parameters
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                async with AsyncRespool(*endpoint()) as rp, rp.allocate(subject, **allocate) as g:
                    if wants_grant:
                        kwargs["grant"] = g
                    return await fn(*args, **kwargs)

            return cast(F, run_async)

        @functools.wraps(fn)
        def run_sync(*args: Any, **kwargs: Any) -> Any:
            with Respool(*endpoint()) as rp, rp.allocate(subject, **allocate) as g:
                if wants_grant:
                    kwargs["grant"] = g
                return fn(*args, **kwargs)

        return cast(F, run_sync)

    return decorate
