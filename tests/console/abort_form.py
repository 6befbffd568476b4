"""The console's admin abort as a person makes it: the confirmation page, then its form posted back
(the producer id, epoch and start time it shows) from the console's own origin."""

from __future__ import annotations

import re

import httpx


def abort_from_the_console(client: httpx.Client, server_url: str, transactional_id: str) -> httpx.Response:
    confirmation = client.get(f"/console/transactions/{transactional_id}?confirm=abort").text
    fields = "&".join(f"{name}={value}" for name, value in re.findall(r'name="(\w+)" value="([^"]*)"', confirmation))
    return client.post(
        f"/console/transactions/{transactional_id}/abort",
        content=fields,
        headers={"Origin": server_url, "Content-Type": "application/x-www-form-urlencoded"},
    )
