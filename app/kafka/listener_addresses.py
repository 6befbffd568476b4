"""The Kafka listener's address settings (`--kafka-listener`, `--kafka-advertised-listener`): HOST:PORT
or 'off'. Apart from listener.py so that `serve`'s checks before it starts anything (app/cli.py: the
refusal to listen beyond loopback unauthenticated, the port a node of several workers holds) read
them without importing the Kafka door and the application core behind it, which the supervisor of
`serve --workers N` never runs."""

from __future__ import annotations

OFF = "off"


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT ([v6]:PORT for IPv6) as (host, port); ValueError saying what was expected."""
    host, separator, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9092), nor 'off'")
    return host, int(port)


def format_address(host: str, port: int) -> str:
    """The HOST:PORT text parse_address reads back ([v6]:PORT for IPv6)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def security_protocol(tls: bool, sasl: bool) -> str:
    """Kafka's name for what a client must speak on the listener (its security.protocol)."""
    if not tls:
        return "SASL_PLAINTEXT" if sasl else "PLAINTEXT"
    return "SASL_SSL" if sasl else "SSL"
