"""A server without authentication answers only requests addressed to a loopback name.

Without authentication txbroker listens on loopback only (`cli.listening_refusal`), so that only
this machine's programs reach it. A browser on this machine is one of them: a page of any site can
have its DNS name resolve to 127.0.0.1 once the page has loaded (DNS rebinding), and its scripts
then read and write this server as their own origin, around the refusal of cross-site writes
(cross_site.py: the Origin is then the page's own host). What such a request cannot hide is the
name it was sent to, in its Host header. So with `auth` off (and `allow_anonymous` not given, which
waives the loopback rule) a request whose Host is not a loopback name (localhost or a name under
.localhost, an address of 127.0.0.0/8, ::1) is refused before it is routed. Programs that connect
to 127.0.0.1 or localhost, the console opened at those addresses, and Kafka's clients (another
listener, no Host) are unaffected.
"""

from __future__ import annotations

import functools
import ipaddress
from urllib.parse import urlsplit

from app.api.responses import error_response
from app.errors import BrokerError, invalid_request


def is_loopback_name(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 with or without brackets) names this machine
    whatever DNS says: localhost and names under .localhost (RFC 6761), loopback addresses."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@functools.lru_cache(maxsize=256)  # a server sees few Host values; parsing one costs microseconds
def _to_loopback(host_header: str) -> bool:
    """Whether a Host header's value (with or without a port) names this machine."""
    return is_loopback_name(urlsplit(f"//{host_header}").hostname or "")


class LoopbackHostsOnly:
    """Pure ASGI middleware, installed only when the server runs without authentication on loopback:
    refuses (400 INVALID_REQUEST, nothing done) an HTTP request whose Host header names anything but
    this machine. A request without Host (HTTP/1.0) is let through: browsers always send it."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"host":
                    host = value.decode("latin-1")
                    if not _to_loopback(host):
                        return await error_response(_refusal(host))(scope, receive, send)
                    break
        return await self.app(scope, receive, send)


def _refusal(host: str) -> BrokerError:
    return invalid_request(
        f"this request was sent to {host[:200]!r}, which is not this machine's loopback name: without "
        f"authentication the server answers only requests to localhost, 127.0.0.1 or [::1] (a page of another "
        f"site whose name resolves to this machine is refused); use http://127.0.0.1:<port>, or start the "
        f"server with --auth required"
    )
