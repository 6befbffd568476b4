"""Property-based fuzzing of the whole HTTP API from its own OpenAPI document (schemathesis), over
real HTTP against a real server and PostgreSQL: whatever bytes arrive, no 500, every error in the
contract's format, and responses that match the documented schemas. Examples are bounded."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from app.server import create_app
from app.settings import Settings

# The document the server serves at /openapi.json, built without starting anything.
schema = schemathesis.openapi.from_dict(create_app(Settings(), "postgresql://unused@/unused").openapi())


@pytest.fixture(scope="module")
def fuzz_server(module_server):
    """One server for the whole module: fuzzing needs many requests, not fresh state."""
    module_server.client.post("/v1/topics", json={"name": "fuzz", "partitions": 2}).raise_for_status()
    return module_server


def check_error_body(response) -> None:
    """Every 4xx/5xx body is {"error": {"code": str, "message": str, "retriable": bool}}, no traceback."""
    if response.status_code < 400:
        return
    body = response.json()
    error = body.get("error") if isinstance(body, dict) else None
    assert isinstance(error, dict) and set(error) == {"code", "message", "retriable"}, body
    assert isinstance(error["code"], str) and isinstance(error["retriable"], bool), body
    assert "Traceback" not in error["message"], body


@schema.parametrize()
@settings(
    max_examples=int(__import__("os").environ.get("TXB_FUZZ_EXAMPLES", "10")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors_and_contract_error_bodies(case, fuzz_server):
    response = case.call(base_url=fuzz_server.url, timeout=30)
    assert response.status_code < 500 or response.status_code == 503, (
        f"{case.method} {case.path} answered {response.status_code}: {response.text[:500]}"
    )
    check_error_body(response)
    if response.status_code < 400:
        case.validate_response(response)
