"""Timed runs of a baseline and of transactions in alternation, added up over rounds."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from bench.processes import CpuMeter
from bench.timed_run import Measurement, WorkloadFactory, measure


@dataclass
class Tally:
    """Measurements of one scenario added up over rounds."""

    seconds: float = 0.0
    records: int = 0
    requests: int = 0
    server_cpu_s: float = 0.0
    postgres_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    other_cpu_s: float = 0.0
    latency_p50_ms: list[float] = field(default_factory=list)  # one per run

    def add(self, m: Measurement) -> None:
        self.seconds += m.seconds
        self.records += m.records
        self.requests += m.requests
        self.server_cpu_s += m.server_cpu_percent * m.seconds / 100
        self.postgres_cpu_s += m.postgres_cpu_percent * m.seconds / 100
        self.client_cpu_s += m.client_cpu_percent * m.seconds / 100
        self.other_cpu_s += m.other_cpu_percent * m.seconds / 100
        self.latency_p50_ms.append(m.latency_p50_ms)

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def latency_ms(self) -> float:
        return statistics.median(self.latency_p50_ms)

    @property
    def server_and_postgres_cpu_s_per_request(self) -> float:
        """What one request (or transaction) costs the machine, which decides throughput once it is busy."""
        return (self.server_cpu_s + self.postgres_cpu_s) / self.requests

    def cpu_cells(self) -> tuple[str, str]:
        percent = (
            f"{100 * self.server_cpu_s / self.seconds:.0f}/{100 * self.postgres_cpu_s / self.seconds:.0f}/"
            f"{100 * self.client_cpu_s / self.seconds:.0f}/{100 * self.other_cpu_s / self.seconds:.0f}"
        )
        return (
            percent,
            f"{1000 * self.server_cpu_s / self.requests:.2f}/{1000 * self.postgres_cpu_s / self.requests:.2f}",
        )


async def measure_alternating(
    baseline: WorkloadFactory,
    contender: WorkloadFactory,
    clients: int,
    rounds: int,
    warmup_s: float,
    seconds: float,
    meter: CpuMeter,
) -> tuple[Tally, Tally]:
    """Runs baseline, contender, baseline, contender... (`rounds` of each), so that the drifts of a
    noisy machine hit both alike."""
    baseline_tally, contender_tally = Tally(), Tally()
    for _ in range(rounds):
        baseline_tally.add(await measure(baseline, clients, warmup_s, seconds, meter))
        contender_tally.add(await measure(contender, clients, warmup_s, seconds, meter))
    return baseline_tally, contender_tally
