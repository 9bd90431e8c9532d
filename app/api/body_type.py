"""Which request bodies the API accepts: JSON only (docs/api.md).

Both :mod:`app.api.edge` (while the API is open, before routing) and :mod:`app.api.auth` (in
every mode, after authentication) refuse any other body type with 415 by this one rule.
"""

from __future__ import annotations

import re

__all__ = ["Headers", "body_type_problem"]

_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_JSON = re.compile(r"^application/(?:[\w.+-]+\+)?json$")

Headers = dict[str, str]
"""Request headers, names lower-cased."""


def body_type_problem(method: str, headers: Headers) -> str | None:
    """Why a request's body type is refused (415), or None.

    A request with a body must say ``Content-Type: application/json``; an unsafe method that
    names another content type is refused even with an empty body.
    """
    if method not in _UNSAFE:
        return None
    ctype = headers.get("content-type")
    has_body = headers.get("content-length", "0").strip() not in ("", "0") or (
        "transfer-encoding" in headers
    )
    if ctype is None:
        return "a request body must be sent as Content-Type: application/json" if has_body else None
    media = ctype.split(";", 1)[0].strip().lower()
    if _JSON.match(media):
        return None
    return f"unsupported Content-Type {media!r}: send application/json"
