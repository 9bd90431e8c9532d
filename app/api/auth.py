"""Bearer-token auth for ``/v1`` (docs/api.md): who is calling, and may they do this?

* ``Authorization: Bearer <token>``. ``RESPOOL_ADMIN_TOKEN`` is an admin token compared in
  constant time; any other token is looked up by its sha256 (:mod:`app.db.tokens`) on every
  request, so a revocation takes effect at once.
* Roles: ``admin`` everything; ``reader`` GET only; ``client`` GET on pools, policies and nodes, and
  every request route for subjects matching its globs. Another subject's request is 404 (its
  existence is not leaked), creating one for another subject is 403, and listing is filtered.
* What a client reads elsewhere (nodes, policies, events, what-if) names another request or
  subject only when its globs cover that subject (:func:`subject_reader`); the rest is blanked.
* 401 (with ``WWW-Authenticate: Bearer``) without a valid, unrevoked token; 403 for a role
  without the right. ``/healthz``, ``/readyz``, ``/metrics`` and ``/schema*`` stay open.
* ``RESPOOL_AUTH=off``: no checks; refused unless the bind host is loopback.
* While ``/v1`` is open (auth off, or bootstrap), :mod:`app.api.edge` refuses foreign ``Host``
  and ``Origin`` headers (403) and non-JSON bodies (415), so a web page cannot drive the API.
  Bodies are JSON only in every mode (415, checked here after authentication).
* Bootstrap: with auth on, no ``RESPOOL_ADMIN_TOKEN``, a loopback bind and no token ever created,
  ``/v1`` is open (with a warning at startup) so that a fresh ``respool serve`` works out of the
  box. The first token created ends it for good (checked on each request until then).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Callable
from typing import Any
from uuid import UUID

import asyncpg
import msgspec
from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Scope

from app import globs
from app.api.body_type import body_type_problem
from app.api.errors import ApiError
from app.db import jobs, tokens
from app.settings import Settings, SettingsError

__all__ = [
    "AuthError",
    "Authenticator",
    "Principal",
    "auth_guard",
    "check_auth_settings",
    "is_loopback",
    "agent_node_write",
    "listing_patterns",
    "require_subject",
    "subject_reader",
]

log = logging.getLogger("respool.api")

_READ_METHODS = frozenset({"GET", "HEAD"})


class Principal(msgspec.Struct, frozen=True):
    """The caller: ``subject_patterns`` (globs) only for clients."""

    name: str
    role: tokens.Role
    subject_patterns: tuple[str, ...] | None = None
    # agents (docs/jobs.md): the node (its id: None while no node of that name is registered),
    # or the pool without nodes, the token is bound to; node_pool_id: the pool its agent may
    # create its node in (None: it may only update it)
    node_id: UUID | None = None
    pool_id: UUID | None = None
    node_name: str | None = None
    node_pool_id: UUID | None = None
    node_pool: str | None = None


OPEN = Principal(name="(auth off)", role="admin")
BOOTSTRAP = Principal(name="(bootstrap: no tokens yet)", role="admin")
ENV_ADMIN = Principal(name="RESPOOL_ADMIN_TOKEN", role="admin")


class AuthError(ApiError):
    """401/403; a 401 carries ``WWW-Authenticate: Bearer``."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(status_code, detail, None)
        self.headers = {"WWW-Authenticate": "Bearer"} if status_code == 401 else {}


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also IPv4-mapped) and ``localhost``."""
    h = host.strip().strip("[]").rstrip(".").lower()
    if h == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(h)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def check_auth_settings(settings: Settings) -> None:
    """Refuse ``RESPOOL_AUTH=off`` on a bind host that is not loopback."""
    if not settings.auth_enabled and not is_loopback(settings.host):
        raise SettingsError(
            f"RESPOOL_AUTH=off is only allowed when binding to loopback (127.0.0.1, ::1, "
            f"localhost), not {settings.host!r}; set RESPOOL_ADMIN_TOKEN and keep auth on"
        )


class Authenticator:
    """Per-app auth state (``app.state.auth``)."""

    def __init__(self, settings: Settings) -> None:
        check_auth_settings(settings)
        self.enabled = settings.auth_enabled
        self._admin_token = settings.admin_token.encode() if settings.admin_token else None
        # Bootstrap may apply only without an admin token and on loopback; it ends for good
        # once a token exists.
        self._bootstrap = self.enabled and self._admin_token is None and is_loopback(settings.host)

    async def startup(self, db: asyncpg.Pool) -> None:
        """Log the mode the server runs in."""
        if not self.enabled:
            log.warning("RESPOOL_AUTH=off: the API does no authentication (loopback bind)")
        elif self._bootstrap and await tokens.tokens_exist(db):
            self._bootstrap = False  # not open: edge checks (app.api.edge) need not apply
        elif self._bootstrap:
            log.warning(
                "auth: no RESPOOL_ADMIN_TOKEN and no tokens yet; the API is open on loopback "
                "until the first token is created"
            )
        elif self._admin_token is None and not await tokens.tokens_exist(db):
            log.warning("auth: no RESPOOL_ADMIN_TOKEN and no tokens; every /v1 call gets 401")

    async def _bootstrapping(self, db: asyncpg.Pool) -> bool:
        if self._bootstrap and await tokens.tokens_exist(db):
            self._bootstrap = False
            log.info("auth: a token exists; bootstrap mode ended, tokens are now required")
        return self._bootstrap

    async def is_open(self, scope: Scope) -> bool:
        """Whether ``/v1`` is open (auth off, or bootstrap): :mod:`app.api.edge` then refuses
        foreign ``Host``/``Origin`` and non-JSON bodies. Outside ``/v1`` the last known answer
        is used, so ``/healthz`` never needs the database."""
        if not self.enabled:
            return True
        if not self._bootstrap:
            return False
        path: str = scope.get("path", "")
        if path == "/v1" or path.startswith("/v1/"):
            return await self._bootstrapping(scope["app"].state.db)
        return True

    async def authenticate(self, connection: ASGIConnection[Any, Any, Any, Any]) -> Principal:
        if not self.enabled:
            return OPEN
        db: asyncpg.Pool = connection.app.state.db
        if await self._bootstrapping(db):
            return BOOTSTRAP
        header = connection.headers.get("authorization")
        if not header:
            raise AuthError(401, "authentication required: send Authorization: Bearer <token>")
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthError(401, "invalid Authorization header: expected Bearer <token>")
        if self._admin_token is not None and hmac.compare_digest(token.encode(), self._admin_token):
            return ENV_ADMIN
        found = await tokens.verify_token(db, token)
        if found is None:
            raise AuthError(401, "invalid or revoked token")
        patterns = tuple(found.subject_patterns or ()) if found.role == "client" else None
        node_bound = found.node is not None
        return Principal(
            name=found.name,
            role=found.role,
            subject_patterns=patterns,
            node_id=found.node_id,
            pool_id=None if node_bound else found.pool_id,
            node_name=found.node,
            node_pool_id=found.pool_id if node_bound else None,
            node_pool=found.pool if node_bound else None,
        )


async def auth_guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Authenticate and authorize every ``/v1`` route (run by :mod:`app.api.route_checks`)."""
    path: str = connection.scope["path"]
    if path != "/v1" and not path.startswith("/v1/"):
        return  # /healthz, /readyz, /metrics, /schema*
    authn: Authenticator = connection.app.state.auth
    principal = await authn.authenticate(connection)
    connection.scope.setdefault("state", {})["principal"] = principal
    method = str(connection.scope.get("method", "GET"))
    await _authorize(connection, principal, path, method)
    # Every mode: bodies are JSON only (open mode already refused them in app.api.edge); after
    # authorization, so a caller without the right still learns only 401/403.
    problem = body_type_problem(method, dict(connection.headers))
    if problem is not None:
        raise ApiError(415, problem)


async def _authorize(
    connection: ASGIConnection[Any, Any, Any, Any], principal: Principal, path: str, method: str
) -> None:
    """403 (or 404 for another subject's request) unless ``principal`` may do this."""
    if principal.role == "admin":
        return
    if principal.role == "agent":
        await _authorize_agent(connection, principal, path, method)
        return
    if path.startswith("/v1/agent/") or path == "/v1/agent":
        raise AuthError(403, f"only agent tokens call /v1/agent (token {principal.name!r})")
    if principal.role == "reader":
        if method not in _READ_METHODS:
            raise AuthError(403, f"role reader may only read (token {principal.name!r})")
        return
    # client
    if not path.startswith("/v1/requests"):
        if method not in _READ_METHODS:
            raise AuthError(
                403,
                f"role client may only read pools, policies and nodes (token {principal.name!r})",
            )
        return
    request_id = connection.path_params.get("request_id")
    if request_id is not None:
        rid = request_id if isinstance(request_id, UUID) else UUID(str(request_id))
        subject = await tokens.request_subject(connection.app.state.db, rid)
        if subject is None or not globs.subject_matches(subject, principal.subject_patterns or ()):
            # Same answer as a missing request: a client learns nothing about other subjects.
            raise ApiError(404, f"request {rid} not found", "id")


_AGENT_ACTIONS = frozenset({"claim", "heartbeat", "release", "logs"})
_AGENT_READS = frozenset({"", "events", "logs"})


async def _authorize_agent(
    connection: ASGIConnection[Any, Any, Any, Any], principal: Principal, path: str, method: str
) -> None:
    """An agent token (docs/jobs.md): its own routes, reads and holder actions on the jobs of
    its node (or pool), and reading, registering and updating its own node (by name; the body
    is checked by :func:`require_own_node`); 404 for any other request, 403 for the rest."""
    if path.startswith("/v1/agent/"):
        if principal.node_name is not None and principal.node_id is None:
            raise ApiError(
                404,
                f"node {principal.node_name} is not registered: start its agent with --register"
                f" (and --detect), or add it with respool node add (token {principal.name!r})",
                "node",
            )
        return
    if principal.node_name is not None and (path == "/v1/nodes" or path.startswith("/v1/nodes/")):
        tail = path.rstrip("/").split("/")[3:]
        if (method == "POST" and not tail) or (
            len(tail) == 1 and method in ("GET", "HEAD", "PATCH")
        ):
            name = connection.path_params.get("name")
            if name is not None:
                require_own_node(principal, str(name))
            return
    request_id = connection.path_params.get("request_id")
    if request_id is not None and path.startswith("/v1/requests/"):
        rid = request_id if isinstance(request_id, UUID) else UUID(str(request_id))
        tail = path.rstrip("/").split("/")[4:]
        action = tail[0] if tail else ""
        allowed = _AGENT_READS if method in _READ_METHODS else _AGENT_ACTIONS
        if len(tail) <= 1 and action in allowed:
            if not await jobs.agent_may_see(
                connection.app.state.db, rid, node_id=principal.node_id, pool_id=principal.pool_id
            ):
                raise ApiError(404, f"request {rid} not found", "id")
            return
    raise AuthError(
        403,
        f"role agent may only run its node's jobs (claim, heartbeat, log and release them) and"
        f" register its own node (token {principal.name!r})",
    )


def require_own_node(principal: Principal, name: str) -> None:
    """403 unless an agent token is bound to node ``name`` (other roles pass)."""
    if principal.role == "agent" and name != principal.node_name:
        bound = f"node {principal.node_name}" if principal.node_name else "a pool, not a node"
        raise AuthError(
            403,
            f"token {principal.name!r} is bound to {bound}: an agent may register or update"
            f" only its own node, not {name}",
        )


def agent_node_write(
    request: Request[Any, Any, Any],
    name: str,
    *,
    pool: str | None,
    pool_given: bool,
    creating: bool,
    state: bool,
    force: bool = False,
) -> str | None:
    """An agent's create or update of its node (docs/jobs.md, "Registering the node"): only
    its own node, in the pool its token names, never a state change or ``force``. Returns the
    pool to use (a create without one: the token's); 403 naming why otherwise. Other roles pass
    ``pool`` through."""
    p = principal_of(request)
    if p.role != "agent":
        return pool
    require_own_node(p, name)
    if state or force:
        what = "state" if state else "force"
        raise AuthError(
            403,
            f"token {p.name!r}: an agent registers and updates its node's units, devices and"
            f" labels; {what} is an admin's to set",
        )
    if pool_given and (pool is None or pool not in (p.node_pool, str(p.node_pool_id))):
        theirs = f"pool {p.node_pool}" if p.node_pool else "no pool"
        asked = f"pool {pool}" if pool is not None else "no pool"
        raise AuthError(
            403, f"token {p.name!r} may place node {name} in {theirs} only, not in {asked}"
        )
    if creating and p.node_pool_id is None:
        raise AuthError(
            403,
            f"token {p.name!r} names no pool to register node {name} in: an admin adds the node"
            f" (respool node add), or creates the agent token with --pool",
        )
    return pool if pool is not None or not creating else str(p.node_pool_id)


def principal_of(request: Request[Any, Any, Any]) -> Principal:
    found = request.scope.get("state", {}).get("principal")
    return found if isinstance(found, Principal) else OPEN


def require_subject(request: Request[Any, Any, Any], subject: str) -> None:
    """403 unless the caller may create requests for ``subject``."""
    p = principal_of(request)
    if p.role == "client" and not globs.subject_matches(subject, p.subject_patterns or ()):
        raise AuthError(403, f"token {p.name!r} may not create requests for subject {subject!r}")


def listing_patterns(request: Request[Any, Any, Any]) -> list[str] | None:
    """SQL LIKE patterns a request listing is restricted to (None: no restriction)."""
    p = principal_of(request)
    if p.role != "client":
        return None
    return [globs.glob_to_like(g) for g in p.subject_patterns or ()]


def subject_reader(request: Request[Any, Any, Any]) -> Callable[[str | None], bool]:
    """Whether the caller may read a given subject (and the ids of its requests): every subject
    for admin and reader tokens (and with auth off), for a client only those its globs cover;
    ``None`` (unknown) only for callers that read everything. Other answers blank the rest."""
    p = principal_of(request)
    if p.role != "client":
        return lambda subject: True
    patterns = p.subject_patterns or ()
    return lambda subject: subject is not None and globs.subject_matches(subject, patterns)
