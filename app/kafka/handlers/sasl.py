"""SaslHandshake and SaslAuthenticate: the connection's SASL exchange, PLAIN or SCRAM (app/kafka/sasl.py)."""

from __future__ import annotations

import datetime

from app.kafka import api_table
from app.kafka.frames import build, response_module
from app.kafka.sasl import ENABLED_MECHANISMS, NO_SESSION_EXPIRY_MS


async def handshake(context, request) -> object:
    error = context.sasl.handshake(request.mechanism, context.api_version)
    module = response_module(api_table.SASL_HANDSHAKE, context.api_version)
    return build(module, "SaslHandshakeResponse", error_code=error, mechanisms=ENABLED_MECHANISMS)


async def authenticate(context, request) -> object:
    error, message, token = await context.sasl.authenticate(request.auth_bytes)
    module = response_module(api_table.SASL_AUTHENTICATE, context.api_version)
    return build(
        module,
        "SaslAuthenticateResponse",
        error_code=error,
        error_message=message,
        auth_bytes=token,
        session_lifetime=datetime.timedelta(milliseconds=NO_SESSION_EXPIRY_MS),
    )
