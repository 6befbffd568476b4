"""The HTTP calls the transaction benchmark makes, over keep-alive connections, and the naive app
serving beside txbroker."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from bench.load_client import LoadClient
from bench.processes import CpuMeter


async def post_json(http: LoadClient, path: str, body: dict) -> dict:
    status, content = await http.post(path, orjson.dumps(body))
    if status not in (200, 201):
        raise RuntimeError(f"POST {path} answered {status}: {content[:500].decode(errors='replace')}")
    return orjson.loads(content)


def check_partitions(answer: dict, request: str) -> list[dict]:
    for entry in answer["partitions"]:
        if entry["error"] is not None:
            raise RuntimeError(f"{request} failed on {entry['topic']}-{entry['partition']}: {entry['error']}")
    return answer["partitions"]


async def create_topic(http: LoadClient, name: str, partitions: int) -> None:
    await post_json(http, "/v1/topics", {"name": name, "partitions": partitions})


def http_client(base_url: str, connections: int) -> LoadClient:
    """Keep-alive connections, one per concurrent client."""
    return LoadClient(base_url, connections)


@dataclass(frozen=True)
class NaiveApp:
    """The naive produce app (bench/naive_app.py) serving beside txbroker, on the raw baseline's
    database: the ceiling of sections 1 and 3's HTTP shape. `meter` counts its processes as the server."""

    url: str
    meter: CpuMeter

    async def create_topic(self, name: str, partitions: int) -> None:
        async with http_client(self.url, 1) as http:
            await create_topic(http, name, partitions)
