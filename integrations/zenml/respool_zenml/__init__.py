"""respool as the resource-pool backend of a self-hosted ZenML server.

Point the ZenML server at the store class and at respool::

    ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE=respool_zenml.store.RespoolResourcePoolStore
    RESPOOL_URL=http://respool:8080  RESPOOL_TOKEN=...

See docs/zenml.md in the respool repository.
"""

from respool_zenml.mapping import (
    demands_to_resources,
    subject_for,
    zenml_status,
)

__all__ = ["demands_to_resources", "subject_for", "zenml_status"]
