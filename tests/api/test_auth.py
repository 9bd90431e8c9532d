"""Auth (docs/api.md): every role against every route, client scoping, hashed tokens, AUTH=off."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from app import globs
from app.api import create_app
from app.api.auth import is_loopback
from app.db import tokens
from app.db.errors import BadInput, Conflict, NotFound
from app.settings import Settings, SettingsError
from cli.main import app as cli_app
from support.db import direct, issue_tokens
from support.http import error, ok
from support.server import Server, running_server

ADMIN_TOKEN = "test-admin-token-0123456789"
ROLES = ("admin", "db_admin", "client", "reader", "revoked", "none", "bad")
UNAUTHENTICATED = ("revoked", "none", "bad")
_names = itertools.count()


def _unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


@dataclass
class AuthEnv:
    server: Server
    headers: dict[str, dict[str, str]]
    plaintexts: list[str]
    policy_id: str

    @property
    def client(self) -> httpx.AsyncClient:
        return self.server.client

    async def admin(self, method: str, path: str, body: Any = None) -> httpx.Response:
        return await self.client.request(method, path, json=body, headers=self.headers["admin"])


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
async def env(module_db_url: str) -> AsyncIterator[AuthEnv]:
    issued = await issue_tokens(module_db_url)
    db_admin, client, reader = issued["admin"], issued["client"], issued["reader"]
    revoked = issued["revoked"]
    headers = {
        "admin": _bearer(ADMIN_TOKEN),
        "db_admin": _bearer(db_admin),
        "client": _bearer(client),
        "reader": _bearer(reader),
        "revoked": _bearer(revoked),
        "none": {},
        "bad": _bearer("rp_not-a-token"),
    }
    async with running_server(module_db_url, auth="on", admin_token=ADMIN_TOKEN) as srv:
        e = AuthEnv(srv, headers, [ADMIN_TOKEN, db_admin, client, reader, revoked], "")
        ok(await e.admin("POST", "/v1/pools", {"name": "p", "capacity": {"gpu": 100000}}), 201)
        pol = ok(await e.admin("POST", "/v1/policies", {"subject": "team-a:x", "pool": "p"}), 201)
        ok(await e.admin("POST", "/v1/policies", {"subject": "team-b:y", "pool": "p"}), 201)
        e.policy_id = pol["id"]
        yield e


# --- the matrix --------------------------------------------------------------------------------

Setup = Callable[[AuthEnv], Awaitable[tuple[str, Any]]]


async def _new_pool(e: AuthEnv) -> str:
    name = _unique("tmp")
    ok(await e.admin("POST", "/v1/pools", {"name": name, "capacity": {"gpu": 1}}), 201)
    return name


async def _new_request(e: AuthEnv, subject: str, *, cancelled: bool = False) -> str:
    body = {"subject": subject, "pool": "p", "resources": {"gpu": 1}}
    rid: str = ok(await e.admin("POST", "/v1/requests", body), 201)["id"]
    if cancelled:
        ok(await e.admin("POST", f"/v1/requests/{rid}/cancel"))
    return rid


def fixed(path: str, body: Any = None) -> Setup:
    async def setup(_: AuthEnv) -> tuple[str, Any]:
        return path, body

    return setup


async def create_pool(_: AuthEnv) -> tuple[str, Any]:
    return "/v1/pools", {"name": _unique("new"), "capacity": {"gpu": 1}}


async def delete_pool(e: AuthEnv) -> tuple[str, Any]:
    return f"/v1/pools/{await _new_pool(e)}", None


async def create_policy(e: AuthEnv) -> tuple[str, Any]:
    return "/v1/policies", {"subject": "team-a:x", "pool": await _new_pool(e)}


async def the_policy(e: AuthEnv) -> tuple[str, Any]:
    return f"/v1/policies/{e.policy_id}", None


async def patch_policy(e: AuthEnv) -> tuple[str, Any]:
    return f"/v1/policies/{e.policy_id}", {"description": "patched"}


async def delete_policy(e: AuthEnv) -> tuple[str, Any]:
    pool = await _new_pool(e)
    pol = ok(await e.admin("POST", "/v1/policies", {"subject": "team-a:x", "pool": pool}), 201)
    return f"/v1/policies/{pol['id']}", None


def create_request(subject: str) -> Setup:
    async def setup(_: AuthEnv) -> tuple[str, Any]:
        return "/v1/requests", {"subject": subject, "pool": "p", "resources": {"gpu": 1}}

    return setup


def on_request(subject: str, suffix: str = "", *, cancelled: bool = False) -> Setup:
    async def setup(e: AuthEnv) -> tuple[str, Any]:
        return f"/v1/requests/{await _new_request(e, subject, cancelled=cancelled)}{suffix}", None

    return setup


OWN, OTHER = "team-a:x", "team-b:y"

# (id, method, setup, admin, client, reader); db_admin expects what admin does, and
# revoked/none/bad get 401 on /v1 (None: an open route, 200 for everyone).
CASES: list[tuple[str, str, Setup, int, int, int]] = [
    ("create-pool", "POST", create_pool, 201, 403, 403),
    ("list-pools", "GET", fixed("/v1/pools"), 200, 200, 200),
    ("get-pool", "GET", fixed("/v1/pools/p"), 200, 200, 200),
    ("patch-pool", "PATCH", fixed("/v1/pools/p", {"description": "x"}), 200, 403, 403),
    ("delete-pool", "DELETE", delete_pool, 204, 403, 403),
    ("create-policy", "POST", create_policy, 201, 403, 403),
    ("list-policies", "GET", fixed("/v1/policies"), 200, 200, 200),
    ("get-policy", "GET", the_policy, 200, 200, 200),
    ("patch-policy", "PATCH", patch_policy, 200, 403, 403),
    ("delete-policy", "DELETE", delete_policy, 204, 403, 403),
    ("create-request-own", "POST", create_request(OWN), 201, 201, 403),
    ("create-request-other", "POST", create_request(OTHER), 201, 403, 403),
    ("list-requests", "GET", fixed("/v1/requests"), 200, 200, 200),
    ("get-request-own", "GET", on_request(OWN), 200, 200, 200),
    ("get-request-other", "GET", on_request(OTHER), 200, 404, 200),
    ("heartbeat-own", "POST", on_request(OWN, "/heartbeat"), 200, 200, 403),
    ("heartbeat-other", "POST", on_request(OTHER, "/heartbeat"), 200, 404, 403),
    ("release-own", "POST", on_request(OWN, "/release"), 200, 200, 403),
    ("release-other", "POST", on_request(OTHER, "/release"), 200, 404, 403),
    ("cancel-own", "POST", on_request(OWN, "/cancel"), 200, 200, 403),
    ("cancel-other", "POST", on_request(OTHER, "/cancel"), 200, 404, 403),
    ("delete-request-own", "DELETE", on_request(OWN, cancelled=True), 204, 204, 403),
    ("delete-request-other", "DELETE", on_request(OTHER, cancelled=True), 204, 404, 403),
    ("events-own", "GET", on_request(OWN, "/events"), 200, 200, 200),
    ("events-other", "GET", on_request(OTHER, "/events"), 200, 404, 200),
]
OPEN_ROUTES = ["/healthz", "/readyz", "/metrics", "/schema/openapi.json"]


def _expected(case: tuple[str, str, Setup, int, int, int], role: str) -> int:
    _, _, _, admin, client, reader = case
    if role in UNAUTHENTICATED:
        return 401
    return {"admin": admin, "db_admin": admin, "client": client, "reader": reader}[role]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_route_matrix(
    env: AuthEnv, case: tuple[str, str, Setup, int, int, int], role: str
) -> None:
    _, method, setup, *_ = case
    path, body = await setup(env)
    r = await env.client.request(method, path, json=body, headers=env.headers[role])
    expected = _expected(case, role)
    if expected < 400:
        assert r.status_code == expected, r.text
        return
    err = error(r, expected, None if expected != 404 else "id")
    if expected == 401:
        assert r.headers["WWW-Authenticate"] == "Bearer"
    for secret in env.plaintexts:
        assert secret not in r.text
    assert err["status_code"] == expected


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("path", OPEN_ROUTES)
async def test_open_routes(env: AuthEnv, path: str, role: str) -> None:
    r = await env.client.get(path, headers=env.headers[role])
    assert r.status_code == 200, r.text


# --- client scoping ----------------------------------------------------------------------------


async def test_client_sees_only_its_subjects(env: AuthEnv) -> None:
    own = await _new_request(env, OWN)
    other = await _new_request(env, OTHER)
    client = env.headers["client"]

    page = ok(await env.client.get("/v1/requests", params={"limit": 1000}, headers=client))
    ids = {item["id"] for item in page["items"]}
    assert own in ids and other not in ids
    assert page["items"] and all(i["subject"].startswith("team-a:") for i in page["items"])
    page = ok(await env.client.get("/v1/requests", params={"subject": OTHER}, headers=client))
    assert page["items"] == []
    # Other roles see both.
    page = ok(
        await env.client.get("/v1/requests", params={"limit": 1000}, headers=env.headers["reader"])
    )
    assert {own, other} <= {item["id"] for item in page["items"]}

    # Another subject's request looks exactly like a missing one.
    hidden = error(await env.client.get(f"/v1/requests/{other}", headers=client), 404, "id")
    missing_id = "00000000-0000-4000-8000-000000000000"
    missing = error(await env.client.get(f"/v1/requests/{missing_id}", headers=client), 404, "id")
    assert hidden["detail"] == missing["detail"].replace(missing_id, other)
    # ... and is left unchanged by the refused action.
    error(await env.client.post(f"/v1/requests/{other}/cancel", headers=client), 404)
    assert ok(await env.admin("GET", f"/v1/requests/{other}"))["status"] == "allocated"


async def test_auth_runs_before_body_validation(env: AuthEnv) -> None:
    r = await env.client.post("/v1/pools", content=b"{not json")
    error(r, 401, None)
    r = await env.client.post("/v1/pools", content=b"{not json", headers=env.headers["reader"])
    error(r, 403, None)


@pytest.mark.parametrize(
    "header",
    [
        "Basic dXNlcjpwYXNz",
        "Bearer",
        f"Bearer  {ADMIN_TOKEN}x",
        ADMIN_TOKEN,
        f"Token {ADMIN_TOKEN}",
    ],
)
async def test_malformed_authorization_is_401(env: AuthEnv, header: str) -> None:
    r = await env.client.get("/v1/pools", headers={"Authorization": header})
    error(r, 401, None)
    assert r.headers["WWW-Authenticate"] == "Bearer"


async def test_bearer_scheme_is_case_insensitive(env: AuthEnv) -> None:
    ok(await env.client.get("/v1/pools", headers={"Authorization": f"bearer {ADMIN_TOKEN}"}))


# --- storage -----------------------------------------------------------------------------------


async def test_tokens_are_stored_hashed(env: AuthEnv) -> None:
    async with direct(env.server.db_url) as conn:
        rows = await conn.fetch("SELECT * FROM respool.tokens")
        listed = await tokens.list_tokens(conn, include_revoked=True)
        active = await tokens.list_tokens(conn)
    dump = repr([dict(r) for r in rows])
    for secret in env.plaintexts:
        assert secret not in dump
    db_tokens = env.plaintexts[1:]  # the env admin token is never in the table
    hashes = {r["token_hash"] for r in rows}
    assert {hashlib.sha256(t.encode()).hexdigest() for t in db_tokens} <= hashes
    assert {t.name for t in listed} >= {"ops", "team-a-ci", "dashboard", "old"}
    assert "old" not in {t.name for t in active}
    assert "token_hash" not in tokens.Token.__struct_fields__


async def test_token_functions(conn: Any) -> None:
    text, tok = await tokens.create_token(
        conn, name="ci", role="client", subject_patterns=["team_a:*"]
    )
    assert text.startswith("rp_") and tok.subject_patterns == ["team_a:*"]
    assert (await tokens.verify_token(conn, text)) == tok
    assert await tokens.verify_token(conn, text + "x") is None
    with pytest.raises(Conflict):
        await tokens.create_token(conn, name="ci", role="reader")
    with pytest.raises(BadInput):
        await tokens.create_token(conn, name="c2", role="client")
    with pytest.raises(BadInput):
        await tokens.create_token(conn, name="c3", role="reader", subject_patterns=["x"])
    with pytest.raises(BadInput):
        await tokens.create_token(conn, name="c4", role="client", subject_patterns=["a b"])
    revoked = await tokens.revoke_token(conn, str(tok.id))
    assert revoked.revoked_at is not None
    assert await tokens.verify_token(conn, text) is None
    with pytest.raises(NotFound):
        await tokens.revoke_token(conn, "ci")  # no active token of that name any more
    # The name is free again once revoked.
    await tokens.create_token(conn, name="ci", role="reader")


@pytest.mark.parametrize(
    ("subject", "pattern", "matches"),
    [
        ("team-a:x", "team-a:*", True),
        ("team-a:", "team-a:*", True),
        ("team-ab:x", "team-a:*", False),
        ("team_a:x", "team_a:*", True),
        ("teamXa:x", "team_a:*", False),  # _ is literal, not LIKE's any-character
        ("team-a:x", "team-?:x", True),
        ("a%b", "a%b", True),
        ("aXb", "a%b", False),
    ],
)
async def test_globs_match_the_same_in_python_and_sql(
    conn: Any, subject: str, pattern: str, matches: bool
) -> None:
    assert globs.subject_matches(subject, [pattern]) is matches
    assert await conn.fetchval("SELECT $1 LIKE $2", subject, globs.glob_to_like(pattern)) is (
        matches
    )


# --- modes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("example.com", False),
        ("", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_auth_off_refused_on_non_loopback_host() -> None:
    with pytest.raises(SettingsError, match="RESPOOL_AUTH=off"):
        create_app(Settings(auth="off", host="0.0.0.0"))
    create_app(Settings(auth="off", host="127.0.0.1"))
    create_app(Settings(auth="off", host="::1"))
    create_app(Settings(auth="on", host="0.0.0.0"))


def test_serve_refuses_auth_off_on_non_loopback_host() -> None:
    result = CliRunner().invoke(
        cli_app,
        ["serve", "--host", "0.0.0.0"],
        env={"RESPOOL_AUTH": "off", "RESPOOL_DATABASE_URL": "postgresql://u@127.0.0.1:1/none"},
    )
    assert result.exit_code == 1, result.output
    assert "RESPOOL_AUTH=off is only allowed when binding to loopback" in result.output
    assert "Traceback" not in result.output


async def test_auth_off_needs_no_token(db_url: str) -> None:
    async with running_server(db_url, auth="off") as srv:
        ok(await srv.client.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1}}), 201)


async def test_bootstrap_on_loopback_until_the_first_token(db_url: str) -> None:
    async with running_server(db_url, auth="on") as srv:
        ok(await srv.client.post("/v1/pools", json={"name": "p", "capacity": {"gpu": 1}}), 201)
        async with direct(db_url) as conn:
            text, _ = await tokens.create_token(conn, name="first", role="admin")
            await tokens.revoke_token(conn, "first")  # even revoked, a token ends bootstrap
            second, _ = await tokens.create_token(conn, name="second", role="reader")
        error(await srv.client.get("/v1/pools"), 401, None)
        error(await srv.client.get("/v1/pools", headers=_bearer(text)), 401, None)
        ok(await srv.client.get("/v1/pools", headers=_bearer(second)))


async def test_no_bootstrap_with_an_admin_token_or_off_loopback(db_url: str) -> None:
    async with running_server(db_url, auth="on", admin_token=ADMIN_TOKEN) as srv:
        error(await srv.client.get("/v1/pools"), 401, None)
        ok(await srv.client.get("/v1/pools", headers=_bearer(ADMIN_TOKEN)))
    async with running_server(db_url, auth="on", host="0.0.0.0") as srv:
        error(await srv.client.get("/v1/pools"), 401, None)
        ok(await srv.client.get("/healthz"))
