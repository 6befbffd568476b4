"""The Kafka listeners' address settings (`--kafka-listener`, `--kafka-advertised-listener`): a
comma-separated list of HOST:PORT or PROTOCOL://HOST:PORT, or 'off'. Apart from listener.py so that
`serve`'s checks before it starts anything (app/cli.py: the refusal to listen beyond loopback
unauthenticated, the ports a node of several workers holds) read them without importing the Kafka
door and the application core behind it, which the supervisor of `serve --workers N` never runs.

A listener's name is its security protocol (Kafka's listener names with a protocol map are not
taken): at most one listener per protocol, which covers Kafka's common layouts (an internal
PLAINTEXT listener beside an external SASL_SSL one). A bare HOST:PORT gets the protocol the
server-wide settings give, as the one listener always had: TLS with the server's certificate, SASL
with `auth` required."""

from __future__ import annotations

from dataclasses import dataclass

OFF = "off"
PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SASL_SSL = "SASL_SSL"
PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
LISTENER_FLAG = "--kafka-listener (TXBROKER_KAFKA_LISTENER)"
ADVERTISED_FLAG = "--kafka-advertised-listener (TXBROKER_KAFKA_ADVERTISED_LISTENER)"
_FORMS = (
    f"HOST:PORT or PROTOCOL://HOST:PORT, comma-separated, PROTOCOL one of {', '.join(PROTOCOLS)} "
    f"(e.g. PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9094)"
)


class ListenerSettingsError(ValueError):
    """Listener settings `serve` refuses to start with; the message says what and what to do."""


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
        return SASL_PLAINTEXT if sasl else PLAINTEXT
    return SASL_SSL if sasl else SSL


@dataclass(frozen=True, slots=True)
class ListenerSetting:
    """One Kafka listener of this node: its security protocol (also its name), where it binds, and
    the address Metadata gives for it (None: the bound one)."""

    protocol: str
    host: str
    port: int
    advertised: tuple[str, int] | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in (SSL, SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self.protocol in (SASL_PLAINTEXT, SASL_SSL)

    @property
    def text(self) -> str:
        """PROTOCOL://HOST:PORT, as kafka_listeners reads it back."""
        return f"{self.protocol}://{format_address(self.host, self.port)}"


def _items(text: str, flag: str) -> list[tuple[str | None, tuple[str, int]]]:
    """(protocol or None for a bare item, (host, port)) of each comma-separated item."""
    items = []
    for raw in text.split(","):
        item = raw.strip()
        protocol, separator, address = item.partition("://")
        if not separator:
            protocol, address = None, item
        elif protocol.upper() not in PROTOCOLS:
            raise ListenerSettingsError(
                f"{flag}: {item!r} names the security protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)} "
                f"(a listener's name is its protocol; Kafka's own listener names are not taken)"
            )
        try:
            items.append((protocol and protocol.upper(), parse_address(address)))
        except ValueError:
            raise ListenerSettingsError(f"{flag}: {item[:200]!r} is not {_FORMS}, nor 'off'") from None
    return items


def kafka_listeners(
    listeners: str, advertised: str | None, *, certificate: bool, auth_required: bool
) -> list[ListenerSetting]:
    """The node's Kafka listeners ([] for 'off'), each with its advertised address; raises
    ListenerSettingsError for settings a node must not start with: an item that is neither form,
    two listeners of one protocol or on one port, SSL without the server's certificate, SASL
    without `auth` required, an advertised address no listener matches."""
    if listeners.strip() == OFF:
        return []  # an advertised address is then ignored, as it always was
    settings = [
        ListenerSetting(protocol or security_protocol(certificate, auth_required), host, port)
        for protocol, (host, port) in _items(listeners, LISTENER_FLAG)
    ]
    for index, setting in enumerate(settings):
        for earlier in settings[:index]:
            if earlier.protocol == setting.protocol:
                raise ListenerSettingsError(
                    f"{LISTENER_FLAG}: two {setting.protocol} listeners ({earlier.text} and {setting.text}): expected "
                    f"at most one per security protocol, which is its name (a bare HOST:PORT is "
                    f"{security_protocol(certificate, auth_required)} with these settings); drop one"
                )
            if earlier.port == setting.port and setting.port != 0:
                raise ListenerSettingsError(
                    f"{LISTENER_FLAG}: {earlier.text} and {setting.text} share port {setting.port}: expected a port "
                    f"of its own for each listener; give one of them another port"
                )
        if setting.tls and not certificate:
            raise ListenerSettingsError(
                f"{LISTENER_FLAG}: {setting.text} speaks TLS, which needs the server's certificate: start with "
                f"--ssl-certfile and --ssl-keyfile (TXBROKER_SSL_CERTFILE, TXBROKER_SSL_KEYFILE), or make it a "
                f"{PLAINTEXT if setting.protocol == SSL else SASL_PLAINTEXT} listener"
            )
        if setting.sasl and not auth_required:
            raise ListenerSettingsError(
                f"{LISTENER_FLAG}: {setting.text} authenticates clients with SASL, which needs --auth required "
                f"(TXBROKER_AUTH): with auth off there is nobody to authenticate, every caller being allowed "
                f"everything; start with --auth required, or make it a "
                f"{PLAINTEXT if setting.protocol == SASL_PLAINTEXT else SSL} listener"
            )
    if advertised is None:
        return settings
    return _with_advertised(settings, advertised)


def node_listeners(settings) -> list[ListenerSetting]:
    """kafka_listeners of a node's Settings (app/settings.py: its listener, advertised listener,
    certificate and auth settings)."""
    return kafka_listeners(
        settings.kafka_listener,
        settings.kafka_advertised_listener,
        certificate=settings.ssl_certfile is not None,
        auth_required=settings.auth == "required",
    )


def _with_advertised(settings: list[ListenerSetting], advertised: str) -> list[ListenerSetting]:
    """Each listener's advertised address: an item PROTOCOL://HOST:PORT is the listener of that
    protocol's, a bare HOST:PORT the listener's at its position."""
    by_index: dict[int, tuple[str, int]] = {}
    protocols = [setting.protocol for setting in settings]
    for position, (protocol, address) in enumerate(_items(advertised, ADVERTISED_FLAG)):
        if protocol is None:
            index = position
            if index >= len(settings):
                raise ListenerSettingsError(
                    f"{ADVERTISED_FLAG}: its item {position + 1} ({format_address(*address)}) has no listener at that "
                    f"position ({len(settings)} in {LISTENER_FLAG}): expected one address per listener, in their "
                    f"order, or PROTOCOL://HOST:PORT naming the listener"
                )
        elif protocol in protocols:
            index = protocols.index(protocol)
        else:
            raise ListenerSettingsError(
                f"{ADVERTISED_FLAG}: {protocol}://{format_address(*address)} names no listener of this node (its "
                f"listeners: {', '.join(s.text for s in settings)}): expected the protocol of one of them"
            )
        if index in by_index:
            raise ListenerSettingsError(
                f"{ADVERTISED_FLAG}: two addresses for the {settings[index].protocol} listener: expected one each"
            )
        by_index[index] = address
    return [
        ListenerSetting(s.protocol, s.host, s.port, by_index.get(index, s.advertised))
        for index, s in enumerate(settings)
    ]
