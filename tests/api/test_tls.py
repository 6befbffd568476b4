"""`txbroker serve --ssl-certfile/--ssl-keyfile` serves HTTPS (uvicorn's TLS), with a certificate made
here by openssl for 127.0.0.1."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import REPO_ROOT, loopback_socket

NEEDS_OPENSSL = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def make_certificate(directory) -> tuple:
    """(certificate, key) PEM files of a self-signed certificate for 127.0.0.1, made in `directory`."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@NEEDS_OPENSSL
def test_serves_https_with_the_given_certificate(database_url, tmp_path):
    cert, key = make_certificate(tmp_path)
    sock = loopback_socket()
    url = f"https://127.0.0.1:{sock.getsockname()[1]}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--fd",
            str(sock.fileno()),
            "--database-url",
            database_url,
            "--ssl-certfile",
            str(cert),
            "--ssl-keyfile",
            str(key),
            "--kafka-listener",
            "off",
        ],
        pass_fds=[sock.fileno()],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"{url}/v1/health", verify=str(cert), timeout=2)
                if health.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "the HTTPS server did not come up"
            time.sleep(0.1)
        assert httpx.get(f"{url}/v1/cluster", verify=str(cert)).json()["nodes"][0]["url"] == url
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not spoken on the TLS port
            httpx.get(url.replace("https://", "http://") + "/v1/health", timeout=5)
        with pytest.raises(httpx.ConnectError):  # and the certificate is checked
            httpx.get(f"{url}/v1/health", timeout=5)
    finally:
        server.kill()
        server.wait(timeout=30)
        sock.close()
