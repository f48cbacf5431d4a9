"""The dashboard's sign-in link: `?token=` is exchanged for an HttpOnly cookie at once, redirected away, and never
logged (issue 15 item 5). Against the real dashboard server (werkzeug, in a thread) and the real API."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from dashboard.session import COOKIE, redact
from tests.server.helpers import auth, sample_batch

NODES_CALLBACK = {"output": "nodes-table.children", "outputs": {"id": "nodes-table", "property": "children"},
                  "inputs": [{"id": "auth", "property": "data", "value": None}], "changedPropIds": ["auth.data"],
                  "state": []}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def access_log() -> Iterator[list[str]]:
    """What the dashboard's werkzeug server writes to its access log."""
    logger = logging.getLogger("werkzeug")
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def _set_cookie(response: httpx.Response) -> str:
    return next(v for k, v in response.headers.multi_items() if k.lower() == "set-cookie" and v.startswith(COOKIE))


def test_url_token_becomes_a_session_cookie_and_never_reaches_the_log(access_log, dashboard_url, live_server,
                                                                      make_token):
    operator = make_token("operator")
    assert httpx.post(live_server + "/api/v1/ingest/samples", json=sample_batch(node="node-s", n=2),
                      headers=auth(make_token("agent", node="node-s")), timeout=30).status_code == 200
    with httpx.Client(base_url=dashboard_url, timeout=30) as browser:
        r = browser.get(f"/jobs?state=running&token={operator}&q=x", follow_redirects=False)
        assert r.status_code == 303
        assert r.headers["location"] == "/jobs?state=running&q=x"  # the same address, without the token
        assert operator not in r.text
        cookie = _set_cookie(r)
        flags = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert cookie.startswith(f"{COOKIE}={operator};")
        assert {"httponly", "samesite=strict", "path=/"} <= flags and "secure" not in flags  # plain http here
        assert browser.cookies.get(COOKIE) == operator
        # Pages work with the cookie alone: a callback answers with the operator's view of the API.
        page = browser.get("/jobs?state=running&q=x")
        assert page.status_code == 200 and operator not in page.text
        nodes = browser.post("/_dash-update-component", json=NODES_CALLBACK)
        assert nodes.status_code == 200 and "node-s" in nodes.text, nodes.text[:300]
    # Without the cookie the same callback is "not signed in", not data.
    anonymous = httpx.post(dashboard_url + "/_dash-update-component", json=NODES_CALLBACK, timeout=30)
    assert anonymous.status_code == 200 and "node-s" not in anonymous.text and "Not signed in" in anonymous.text
    # Behind a TLS-terminating proxy the cookie is Secure.
    r = httpx.get(f"{dashboard_url}/?token={operator}", headers={"X-Forwarded-Proto": "https"}, timeout=30)
    assert r.status_code == 303 and "secure" in _set_cookie(r).lower().replace(" ", "").split(";")
    assert r.headers["location"] == "/"
    # The access log saw every request, and not the token.
    log = "\n".join(access_log)
    assert "GET /jobs?state=running&token=[redacted]&q=x" in log, log[-2000:]
    assert operator not in log and operator[3:20] not in log


def test_redaction_covers_encodings_and_bare_tokens():
    secret = "fp_" + "A1b2_C3-d4" * 4
    for line in (f'"GET /?token={secret} HTTP/1.1" 303 -', f'"GET /x?a=1&TOKEN={secret}&b=2 HTTP/1.1"',
                 f'"GET /?%74oken%3D{secret} HTTP/1.1"', f"code 400, message Bad request syntax ('{secret}')"):
        assert secret not in redact(line) and "[redacted]" in redact(line), line
    assert redact('"GET /jobs?state=running HTTP/1.1" 200 -') == '"GET /jobs?state=running HTTP/1.1" 200 -'
