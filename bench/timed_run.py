"""Runs a workload with concurrent clients for a fixed time and measures it: the requests and records
that complete inside the measured window, their latency, and the CPU each party used in it.

Clients are asyncio tasks, in this process or spread over client subprocesses (`ClientProcesses`)
when one Python process cannot drive the server hard enough. Every process uses the same window,
given in time.monotonic() seconds: Linux's CLOCK_MONOTONIC is shared by all processes of a machine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from bench.processes import CpuMeter, CpuSnapshot
from bench.workloads import Workload

WorkloadFactory = Callable[[], Workload]  # picklable (a functools.partial) to run in a subprocess


@dataclass(frozen=True)
class ClientRun:
    """What one client process measured."""

    latencies_s: list[float]  # one per request completed inside the window
    records: int
    cpu_s: float  # of this client process, inside the window


@dataclass(frozen=True)
class Measurement:
    seconds: float
    requests: int
    records: int
    latency_p50_ms: float
    client_cpu_percent: float  # % of one core, every client process together
    server_cpu_percent: float
    postgres_cpu_percent: float
    other_cpu_percent: float  # everything else the machine ran meanwhile: noise when high

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def cpu_us_per_record(self) -> float:
        """CPU of client, server and PostgreSQL together per record: what a record costs the machine,
        which, unlike records/s, hardly depends on what else the machine runs."""
        cpu_percent = self.client_cpu_percent + self.server_cpu_percent + self.postgres_cpu_percent
        return 1e4 * cpu_percent * self.seconds / self.records if self.records else float("nan")

    @property
    def server_cpu_ms_per_request(self) -> float:
        """The HTTP server's CPU per request: 1000 / this is what it could serve with a core of its own."""
        return 10 * self.server_cpu_percent * self.seconds / self.requests if self.requests else float("nan")


def median_of(measurements: list[Measurement]) -> Measurement:
    """Field by field, the median of repeated measurements of one scenario: on a noisy machine, a
    round disturbed by another program does not decide the result."""
    return Measurement(
        **{
            field.name: statistics.median(getattr(m, field.name) for m in measurements)
            for field in dataclasses.fields(Measurement)
        }
    )


def _call_at_monotonic(instant: float, callback: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    loop.call_at(loop.time() + instant - time.monotonic(), callback)


async def drive(workload: Workload, clients: list[int], window_start: float, window_end: float) -> ClientRun:
    """Each client sends requests back to back until window_end; counts those completing inside."""
    await workload.open(clients)
    try:
        cpu_marks: list[float] = []
        _call_at_monotonic(window_start, lambda: cpu_marks.append(time.process_time()))
        _call_at_monotonic(window_end, lambda: cpu_marks.append(time.process_time()))
        latencies: list[float] = []
        records = 0

        async def client_loop(client: int) -> None:
            nonlocal records
            while (started := time.monotonic()) < window_end:
                moved = await workload.run_once(client)
                done = time.monotonic()
                if window_start <= done <= window_end:
                    records += moved
                    latencies.append(done - started)

        await asyncio.gather(*(client_loop(client) for client in clients))
    finally:
        await workload.close()
    while len(cpu_marks) < 2:  # a timer the loop had no time to run: the window closes now
        cpu_marks.append(time.process_time())
    return ClientRun(latencies, records, cpu_marks[1] - cpu_marks[0])


def _drive_in_this_process(
    make_workload: WorkloadFactory, clients: list[int], window_start: float, window_end: float
) -> ClientRun:
    return asyncio.run(drive(make_workload(), clients, window_start, window_end))


class ClientProcesses:
    """A pool of spawned client processes, started once (importing the client libraries takes a while).
    `niceness`: added to the processes' nice value (os.nice) at their start."""

    def __init__(self, count: int, niceness: int = 0) -> None:
        self.count = count
        self.pool = ProcessPoolExecutor(
            count,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=os.nice if niceness else None,
            initargs=(niceness,) if niceness else (),
        )
        for future in [self.pool.submit(time.sleep, 0.2) for _ in range(count)]:
            future.result()

    def close(self) -> None:
        self.pool.shutdown()


async def _server_cpu_in_window(
    meter: CpuMeter, window_start: float, window_end: float
) -> tuple[CpuSnapshot, CpuSnapshot]:
    await asyncio.sleep(window_start - time.monotonic())
    start = meter.snapshot()
    await asyncio.sleep(window_end - time.monotonic())
    return start, meter.snapshot()


async def measure(
    make_workload: WorkloadFactory,
    clients: int,
    warmup_s: float,
    seconds: float,
    meter: CpuMeter,
    client_processes: ClientProcesses | None = None,
) -> Measurement:
    """`clients` concurrent clients, in this process or spread over `client_processes`, run for
    warmup_s unmeasured (connections open, caches warm), then seconds measured."""
    window_start = time.monotonic() + warmup_s
    window_end = window_start + seconds
    server_cpu = asyncio.create_task(_server_cpu_in_window(meter, window_start, window_end))
    if client_processes is None:
        runs = [await drive(make_workload(), list(range(clients)), window_start, window_end)]
    else:
        loop = asyncio.get_running_loop()
        count = min(client_processes.count, clients)
        runs = await asyncio.gather(
            *(
                loop.run_in_executor(
                    client_processes.pool,
                    _drive_in_this_process,
                    make_workload,
                    list(range(first, clients, count)),
                    window_start,
                    window_end,
                )
                for first in range(count)
            )
        )
    start, end = await server_cpu
    latencies = [latency for run in runs for latency in run.latencies_s]
    return measurement_of(
        seconds, len(latencies), sum(run.records for run in runs), latencies, sum(run.cpu_s for run in runs), start, end
    )


def measurement_of(
    seconds: float,
    requests: int,
    records: int,
    latencies_s: list[float],
    client_cpu_s: float,
    start: CpuSnapshot,
    end: CpuSnapshot,
) -> Measurement:
    """A Measurement of `seconds` measured, the server's and PostgreSQL's CPU between two snapshots."""
    elapsed = end.at - start.at
    client, server, postgres, machine = (
        100 * client_cpu_s / seconds,
        100 * (end.server_s - start.server_s) / elapsed,
        100 * (end.postgres_s - start.postgres_s) / elapsed,
        100 * (end.machine_s - start.machine_s) / elapsed,
    )
    return Measurement(
        seconds=seconds,
        requests=requests,
        records=records,
        latency_p50_ms=1000 * statistics.median(latencies_s) if latencies_s else float("nan"),
        client_cpu_percent=client,
        server_cpu_percent=server,
        postgres_cpu_percent=postgres,
        other_cpu_percent=max(machine - client - server - postgres, 0.0),
    )
