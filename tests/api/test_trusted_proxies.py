"""`trusted_proxies` (`--trusted-proxies`, TXBROKER_TRUSTED_PROXIES): behind a reverse proxy the audit
log names the client the proxy saw, not the proxy, and the console's sign-in cookie is Secure when the
proxy ended TLS. Only the peers named are believed: without the setting no X-Forwarded-For is
(tests/kafka/test_audit.py), and a client that is not a trusted proxy cannot name another address."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from pydantic import ValidationError

from app.settings import Settings
from tests.kafka.test_audit import ADMIN_TOKEN, entries_of, post_from_a_port_of_our_own


def created_topic_entry(server, topic: str, forwarded_for: str, proto: str = "http") -> dict:
    status, _port = post_from_a_port_of_our_own(
        server.url,
        "/v1/topics",
        {"name": topic, "partitions": 1},
        {"X-Forwarded-For": forwarded_for, "X-Forwarded-Proto": proto},
    )
    assert status == 201
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as admin:
        [entry] = [e for e in entries_of(admin) if e["action"] == "create topic" and e["resource"] == topic]
    return entry


def test_a_trusted_proxys_forwarded_for_names_the_client_in_the_audit_log(make_server):
    server = make_server(auth="required", admin_token=ADMIN_TOKEN, trusted_proxies="127.0.0.1, 10.0.0.0/8")
    # The client, then a second proxy of ours: the first address not of a trusted proxy, from the right.
    assert created_topic_entry(server, "behind-two", "198.51.100.9, 10.1.2.3")["client_address"] == "198.51.100.9"
    # A client that put an address of its own first: the proxy appended the one it saw, which wins.
    assert created_topic_entry(server, "forged", "192.0.2.66, 203.0.113.7")["client_address"] == "203.0.113.7"
    assert created_topic_entry(server, "ipv6", "2001:db8::5")["client_address"] == "2001:db8::5"


def test_a_peer_that_is_not_a_trusted_proxy_is_named_itself(make_server):
    server = make_server(auth="required", admin_token=ADMIN_TOKEN, trusted_proxies="10.0.0.0/8")
    entry = created_topic_entry(server, "untrusted-peer", "203.0.113.7")
    assert entry["client_address"].startswith("127.0.0.1:"), entry


def test_the_console_cookie_is_secure_behind_a_proxy_that_ended_tls(make_server):
    server = make_server(auth="required", admin_token=ADMIN_TOKEN, trusted_proxies="127.0.0.1")
    headers = {"Content-Type": "application/x-www-form-urlencoded", "X-Forwarded-For": "198.51.100.9"}
    answers = {
        proto: httpx.post(
            f"{server.url}/console/login",
            content=f"api_key={ADMIN_TOKEN}&next=/console",
            headers={**headers, "X-Forwarded-Proto": proto},
        )
        for proto in ("https", "http")
    }
    assert answers["https"].status_code == 303
    assert "secure" in answers["https"].headers["set-cookie"].lower()
    assert "secure" not in answers["http"].headers["set-cookie"].lower()


@pytest.mark.parametrize("value", ["proxy.internal", "10.0.0.0/33", "*", "10.0.0.1,,10.0.0.2"])
def test_a_trusted_proxy_that_is_no_address_is_refused(value):
    with pytest.raises(ValidationError, match="not an IP address or network"):
        Settings(trusted_proxies=value)


def test_trusted_proxies_are_written_out_as_networks():
    assert Settings(trusted_proxies=" 10.0.0.5 ,192.168.1.7/16,::1").trusted_proxies == (
        "10.0.0.5/32,192.168.0.0/16,::1/128"
    )


def test_serve_refuses_a_trusted_proxy_that_is_no_address(tmp_path):
    """Before anything starts (no PostgreSQL, no port), with what to write instead."""
    finished = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--trusted-proxies", "proxy.internal", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 2, finished
    assert "TXBROKER_TRUSTED_PROXIES" in finished.stderr and "CIDR" in finished.stderr, finished.stderr
    assert not any(tmp_path.iterdir())
