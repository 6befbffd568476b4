"""examples/curl-walkthrough.sh, the curl lines the README quotes, passes against a real server (real
HTTP, real PostgreSQL): every response it checks is what the contract says."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT, RunningServer

WALKTHROUGH = REPO_ROOT / "examples" / "curl-walkthrough.sh"


@pytest.mark.skipif(shutil.which("curl") is None, reason="the walkthrough needs curl")
def test_curl_walkthrough_passes(server: RunningServer) -> None:
    result = subprocess.run(["bash", str(WALKTHROUGH), server.url], capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, (
        f"{WALKTHROUGH.name} exited with {result.returncode}\n--- stdout ---\n{result.stdout}"
        f"\n--- stderr ---\n{result.stderr}"
    )
    assert "The walkthrough passed" in result.stdout
