"""What a handler may use: the app's operations, the connection's principal and where clients reach this node."""

from __future__ import annotations

from dataclasses import dataclass

from app.kafka.broker_calls import BrokerCalls

CLUSTER_ID = "txbroker"


@dataclass(frozen=True, slots=True)
class RequestContext:
    calls: BrokerCalls
    # The connection's Principal (sasl.SaslSession.principal), passed back to every call.
    principal: object
    advertised_host: str
    advertised_port: int
    api_version: int
    # The request header's client id and the connection's peer: what DescribeGroups shows of a member.
    client_id: str = ""
    client_host: str = ""
    # The connection's peer as HOST:PORT (None: unknown): what the audit entries of its
    # administrative requests name (BrokerCalls' client_address).
    client_address: str | None = None
    # The connection's SaslSession: what SaslHandshake and SaslAuthenticate act on (handlers/sasl.py).
    sasl: object = None
    # The connection's read ahead (BrokerCalls.new_read_ahead), which Fetch hands back to the core.
    read_ahead: object = None
    # The security protocol (also the name) of the listener the request came in on: whose address of
    # each node Metadata, FindCoordinator and DescribeCluster answer (listener.AdvertisedListener).
    listener: str = "PLAINTEXT"

    async def listed_nodes(self):
        """The cluster's nodes as this request's listener reaches them (BrokerCalls.node_listing):
        what Metadata, FindCoordinator and DescribeCluster answer, and whom they name leaders and
        coordinators."""
        return await self.calls.node_listing(self.advertised_host, self.advertised_port, self.listener)
