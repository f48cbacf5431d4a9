"""API tokens: creation (plaintext shown once), SHA-256 storage, lookup, and scope checks."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.errors import Forbidden, InvalidInput, NotAuthenticated, NotFound
from server.models import SCOPES, ApiToken
from server.models.base import utcnow

TOKEN_PREFIX = "fp_"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the scope of their token, and the team or node it is bound to."""

    token_id: int
    scope: str
    team: str | None = None
    node: str | None = None

    @property
    def reads_all_jobs(self) -> bool:
        return self.scope in ("scheduler", "operator")

    def can_see_team(self, team: str | None) -> bool:
        return self.reads_all_jobs or (self.scope == "team" and team is not None and team == self.team)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, *, scope: str, team: str | None = None, node: str | None = None,
                 description: str | None = None) -> str:
    if scope not in SCOPES:
        raise InvalidInput(f"unknown scope {scope!r}; one of {', '.join(SCOPES)}")
    if scope == "team" and not team:
        raise InvalidInput("a team token needs --team")
    if scope == "agent" and not node:
        raise InvalidInput("an agent token needs --node (the node it may write for); use '*' for any node")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiToken(token_sha256=hash_token(token), prefix=token[:10], scope=scope, team=team, node=node,
                         description=description))
    session.flush()
    return token


def list_tokens(session: Session, *, include_revoked: bool = False) -> list[ApiToken]:
    stmt = select(ApiToken).order_by(ApiToken.id)
    if not include_revoked:
        stmt = stmt.where(ApiToken.revoked_at.is_(None))
    return list(session.scalars(stmt))


def revoke_token(session: Session, *, token_id: int | None = None, token: str | None = None) -> tuple[ApiToken, bool]:
    """Revoke by id or by the plaintext (hashed here, as on every request); (row, revoked now). Collectors that
    cached the token refuse it once their entry expires (TokenCache.ttl_s)."""
    if (token_id is None) == (token is None):
        raise InvalidInput("revoke a token by its id or by the token itself: one of the two")
    row = session.get(ApiToken, token_id) if token_id is not None else session.scalars(
        select(ApiToken).where(ApiToken.token_sha256 == hash_token(token or ""))).first()
    if row is None:
        raise NotFound(f"no token {token_id}" if token_id is not None else "no such token")
    if row.revoked_at is not None:
        return row, False
    row.revoked_at = utcnow()
    session.flush()
    return row, True


class TokenCache:
    """Positive lookups cached briefly: ingest authenticates hundreds of requests per second."""

    def __init__(self, ttl_s: float = 30.0):
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, Principal]] = {}
        self._lock = threading.Lock()

    def get(self, digest: str) -> Principal | None:
        with self._lock:
            hit = self._entries.get(digest)
        if hit and hit[0] > time.monotonic():
            return hit[1]
        return None

    def put(self, digest: str, principal: Principal) -> None:
        with self._lock:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[digest] = (time.monotonic() + self.ttl_s, principal)


def bearer_digest(authorization: str | None) -> str:
    """The stored form (SHA-256 hex) of the bearer token in an Authorization header; 401 when there is none."""
    if not authorization or not authorization.lower().startswith("bearer "):
        raise NotAuthenticated("missing bearer token (Authorization: Bearer <token>)")
    return hash_token(authorization[7:].strip())


def authenticate(session: Session, digest: str, cache: TokenCache | None = None) -> Principal:
    """The principal of a token digest (see bearer_digest), from the cache or the database."""
    if cache is not None and (hit := cache.get(digest)) is not None:
        return hit
    row = session.scalars(select(ApiToken).where(ApiToken.token_sha256 == digest)).first()
    # The lookup is by digest; compare_digest keeps the final check constant-time all the same.
    if row is None or row.revoked_at is not None or not hmac.compare_digest(row.token_sha256, digest):
        raise NotAuthenticated("invalid or revoked token")
    principal = Principal(row.id, row.scope, row.team, row.node)
    if cache is not None:
        cache.put(digest, principal)
    return principal


def require_scope(principal: Principal, *scopes: str) -> Principal:
    if principal.scope == "operator" or principal.scope in scopes:
        return principal
    needed = " or ".join(_with_article(f"{s} token") for s in scopes) or "an operator token"
    raise Forbidden(f"{_with_article(principal.scope + ' token')} cannot do this (needs {needed})")


def _with_article(noun: str) -> str:
    return ("an " if noun[:1] in "aeiou" else "a ") + noun

