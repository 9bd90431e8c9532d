"""respool-client: what a pipeline step needs to get its GPUs from respool (``docs/client.md``).

```python
from respool_client import Respool, ResourceSettings

with Respool(url, token) as rp:
    with rp.allocate("orchestrator:prod-stack",
                     settings=ResourceSettings(gpu_count=3, cpu_count=1, memory="2GB"),
                     timeout=3600) as grant:      # blocks until allocated
        ...                                       # heartbeats run in the background
        if grant.preempted: ...
        os.environ.update(grant.env())            # on a node: CUDA_VISIBLE_DEVICES too
```

Dependencies: httpx and msgspec only. The wire types of the HTTP API are in
:mod:`respool_client.wire`.
"""

from respool_client._async import AsyncRespool
from respool_client._sync import Respool
from respool_client.decorator import allocated
from respool_client.errors import AllocationTimeout, ApiError, Preempted, Rejected, RespoolError
from respool_client.grant import Grant, OnPreempted, Reservation
from respool_client.wire import (
    REASONS,
    STATUSES,
    TERMINAL,
    Placement,
    Request,
    RequestCreate,
    ResourceSettings,
    Status,
)

__all__ = [
    "REASONS",
    "STATUSES",
    "TERMINAL",
    "allocated",
    "AllocationTimeout",
    "ApiError",
    "AsyncRespool",
    "Grant",
    "OnPreempted",
    "Placement",
    "Preempted",
    "Rejected",
    "Request",
    "RequestCreate",
    "Reservation",
    "ResourceSettings",
    "Respool",
    "RespoolError",
    "Status",
]
