"""Fixtures of the crash tests."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from app.runtime.embedded_postgres import EmbeddedPostgres


@pytest.fixture
def own_postgres():
    """A PostgreSQL of the test's own (started with the launcher the server uses), not the
    session's, for a test that stops or kills it."""
    data_dir = Path(tempfile.mkdtemp(prefix="txb-outage-"))
    postgres = EmbeddedPostgres(data_dir / "pg")
    postgres.start()
    try:
        yield postgres
    finally:
        postgres.stop(immediate=True)
        shutil.rmtree(data_dir, ignore_errors=True)
