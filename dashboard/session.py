"""The visitor's API token as a session cookie, and an access log that never holds a token.

A link `/?token=fp_...` (what `fleetprof up` prints) is exchanged at once, before any page is served, for an
HttpOnly, SameSite=Strict cookie (Secure when served over https), and the browser is sent to the same address
without the token: it leaves the address bar, the history and any referrer. Page scripts cannot read the cookie;
SameSite=Strict keeps other sites from making the browser call the dashboard's callbacks with it. The cookie holds
the API token itself, so the dashboard process keeps no per-user state (several replicas, restarts); it lasts until
the browser closes or the visitor signs out.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, TypedDict
from urllib.parse import urlencode

from flask import has_request_context, redirect, request
from werkzeug.serving import WSGIRequestHandler

COOKIE = "fleetprof_session"


class AuthStore(TypedDict):
    """The browser's `auth` store (session storage, readable by page scripts): never the token itself."""

    session: str  # fingerprint(token)
    scope: str | None  # "operator" or "reader"; None while the API cannot say (unreachable)
URL_PARAM = "token"

# What the access log must never show: a token= query parameter (any case, percent-decoded or not) and anything
# shaped like a fleetprof token wherever it appears.
_SECRETS = re.compile(r"(?i)((?:^|[?&;\s\"'])(?:token|%74oken)(?:=|%3D))[^&;\s\"'#]*|\bfp_[A-Za-z0-9_-]{16,}")


def redact(text: str) -> str:
    return _SECRETS.sub(lambda m: (m.group(1) or "") + "[redacted]", text)


class RedactingRequestHandler(WSGIRequestHandler):
    """Werkzeug's request handler, whose access and error log lines go through `redact`."""

    def log(self, type: str, message: str, *args: Any) -> None:
        super().log(type, "%s", redact(message % args if args else message))


def is_https(request: Any) -> bool:
    """Served over https: directly, or behind a proxy that says so (a wrong claim only makes the cookie Secure)."""
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return bool(request.is_secure) or forwarded == "https"


# `response`: a Flask response, or the adapter Dash gives a callback (dash.callback_context.response), which has
# set_cookie but no delete_cookie.
def set_session(response: Any, request: Any, token: str) -> None:
    response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", secure=is_https(request), path="/")


def clear_session(response: Any) -> None:
    response.set_cookie(COOKIE, "", max_age=0, expires=0, httponly=True, samesite="Strict", path="/")


def request_token() -> str | None:
    """The API token of the visitor of the current request (its session cookie), if signed in."""
    return (request.cookies.get(COOKIE) or None) if has_request_context() else None


def fingerprint(token: str) -> str:
    """Names a session in the browser's store without the token (the store is readable by page scripts)."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def install_token_exchange(server: Any) -> None:
    """`?token=` on any address: set the session cookie and redirect (303) to the address without it."""
    @server.before_request
    def _exchange() -> Any:
        if URL_PARAM not in request.args:
            return None
        token = request.args.get(URL_PARAM, "").strip()
        rest = [(k, v) for k, v in request.args.items(multi=True) if k != URL_PARAM]
        response = redirect(request.path + (f"?{urlencode(rest)}" if rest else ""), code=303)
        if token:
            set_session(response, request, token)
        return response
