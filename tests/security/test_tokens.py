"""Tokens: only digests at rest, refused once revoked, compared by digest (nothing to time against)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time

from sqlalchemy import text

from tests.server.helpers import auth


def _token_rows(engine) -> list[dict]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text("SELECT * FROM api_tokens"))]


def test_the_database_holds_digests_not_tokens(cli_env, clean_db, make_token):
    # The real CLI path: `fleetprof token create` prints the token once, on its last line.
    out = subprocess.run([sys.executable, "-m", "fleetprof.cli", "token", "create", "--scope", "team", "--team",
                          "alpha"], env=cli_env, capture_output=True, text=True, timeout=120, check=True)
    tokens = [out.stdout.strip().splitlines()[-1], make_token("operator"), make_token("agent", node="n1")]
    rows = _token_rows(clean_db)
    assert len(rows) == 3
    digests = {r["token_sha256"] for r in rows}
    for token in tokens:
        assert hashlib.sha256(token.encode()).hexdigest() in digests
        for row in rows:
            for column, value in row.items():
                # Only the first 10 characters are kept, to tell tokens apart in listings (like GitHub's prefix).
                assert token[10:20] not in str(value), f"plaintext of a token in api_tokens.{column}"
    # Nor anywhere else in the database: a dump of every table holds no token.
    with clean_db.connect() as conn:
        tables = [t for (t,) in conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname='public'"))]
        dump = "".join(str(row) for t in tables for row in conn.execute(text(f'SELECT * FROM "{t}"')))
    for token in tokens:
        assert token not in dump


def _revoke(engine, token: str) -> None:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        conn.execute(text("UPDATE api_tokens SET revoked_at = now() WHERE token_sha256 = :d"),
                     {"d": hashlib.sha256(token.encode()).hexdigest()})


def test_revoked_near_miss_and_malformed_tokens_are_401(api, make_token, clean_db):
    token = make_token("operator")
    assert api.get("/api/v1/nodes", headers=auth(token)).status_code == 200
    assert api.get("/api/v1/nodes", headers={"Authorization": f"bearer {token}"}).status_code == 200
    near_misses = [token[:-1] + ("A" if token[-1] != "A" else "B"), token[:-1], token + "x", token.upper(),
                   token[:10], "", "fp_", f"Basic {token}", f"Bearer{token}", f"Token {token}"]
    for bad in near_misses:
        header = bad if bad.startswith(("Basic", "Bearer", "Token")) else f"Bearer {bad}"
        r = api.get("/api/v1/nodes", headers={"Authorization": header})
        assert r.status_code == 401, (bad, r.status_code)
        # The problem-details fields and nothing else (no data): server/errors.py
        assert r.headers["www-authenticate"] == "Bearer" and set(r.json()) == {"type", "title", "status", "detail"}
    # A revoked token that this collector has not cached is refused at once.
    fresh = make_token("operator")
    _revoke(clean_db, fresh)
    assert api.get("/api/v1/nodes", headers=auth(fresh)).status_code == 401


def test_revocation_reaches_a_collector_within_the_cache_ttl(api, make_token, clean_db):
    # Positive lookups are cached per collector (ingest authenticates hundreds of requests a second): a revoked
    # token still works there until its entry expires, TokenCache.ttl_s (30 s in production).
    api.app.state.token_cache.ttl_s = 0.3
    token = make_token("operator")
    assert api.get("/api/v1/nodes", headers=auth(token)).status_code == 200
    _revoke(clean_db, token)
    time.sleep(0.4)
    assert api.get("/api/v1/nodes", headers=auth(token)).status_code == 401


def test_comparison_is_on_digests_in_constant_time():
    # The lookup is by SHA-256 digest (the plaintext is never compared), then confirmed with compare_digest.
    import inspect

    from server.auth import service

    source = inspect.getsource(service.authenticate)
    assert "hmac.compare_digest" in source
    assert "hash_token(" in inspect.getsource(service.bearer_digest)
    for fn in (service.authenticate, service.bearer_digest):
        source = inspect.getsource(fn)
        assert " == token" not in source and "token ==" not in source


def _cli(cli_env, *args: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run([sys.executable, "-m", "fleetprof.cli", "token", *args], env=cli_env, capture_output=True,
                          text=True, timeout=120)


def test_tokens_are_listed_without_their_secret_and_revoked_from_the_cli(cli_env, api, make_token):
    team = _cli(cli_env, "create", "--scope", "team", "--team", "alpha", "--description", "ci bot")
    team_token = team.stdout.strip().splitlines()[-1]
    operator = make_token("operator")
    listing = _cli(cli_env, "list")
    assert listing.returncode == 0, listing.stderr
    assert team_token[:10] in listing.stdout and "ci bot" in listing.stdout and "alpha" in listing.stdout
    assert team_token not in listing.stdout and operator not in listing.stdout  # the prefix only
    team_id = next(line.split()[0] for line in listing.stdout.splitlines() if team_token[:10] in line)
    assert api.get("/api/v1/jobs", headers=auth(team_token)).status_code == 200

    revoked = _cli(cli_env, "revoke", team_id)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout, revoked.stderr
    api.app.state.token_cache._entries.clear()  # another collector, or this one 30 s later
    assert api.get("/api/v1/jobs", headers=auth(team_token)).status_code == 401
    assert api.get("/api/v1/jobs", headers=auth(operator)).status_code == 200  # only that one
    assert "already revoked" in _cli(cli_env, "revoke", "--token", team_token).stdout
    assert team_token[:10] not in _cli(cli_env, "list").stdout
    assert team_token[:10] in _cli(cli_env, "list", "--all").stdout

    by_token = _cli(cli_env, "revoke", "--token", operator)
    assert by_token.returncode == 0 and "revoked" in by_token.stdout
    for bad, code in ((["revoke", "999999"], 3), (["revoke", "--token", "fp_not-a-token"], 3), (["revoke"], 2)):
        r = _cli(cli_env, *bad)  # not found 3, usage 2 (fleetprof.errors)
        assert r.returncode == code and "error" in r.stderr and "Traceback" not in r.stderr, (bad, r.stderr)
