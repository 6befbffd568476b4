"""Runs confluent-kafka clients (bench/kafka/clients.py) in the client processes for one window and
turns what they report into bench.timed_run's Measurement, so a Kafka row has the same columns as
the baselines measured with timed_run (records/s, CPU of client, server, PostgreSQL, the rest)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from multiprocessing.managers import SyncManager

from bench.kafka.clients import WAIT_S, ClientRun, Window
from bench.processes import CpuMeter
from bench.timed_run import ClientProcesses, Measurement, measurement_of

ClientCall = Callable[..., ClientRun]  # called with window=


async def measure_clients(
    calls: list[ClientCall],
    pool: ClientProcesses,
    manager: SyncManager,
    meter: CpuMeter,
    warmup_s: float,
    seconds: float,
    fixed_window: bool = False,
) -> tuple[Measurement, list[float]]:
    """Each call runs in a client process; once all are ready (bench/kafka/clients.py's Window),
    returns the measurement and every latency reported. `fixed_window`: the clients count what
    completed inside the measured time, after warmup_s; otherwise they start measuring at once and
    finish what they started (a producer's flush), and the time runs to the last one's finish."""
    barrier = manager.Barrier(len(calls) + 1)
    window = Window(barrier, warmup_s, seconds)
    loop = asyncio.get_running_loop()
    futures = [loop.run_in_executor(pool.pool, partial(call, window=window)) for call in calls]
    try:
        await loop.run_in_executor(None, barrier.wait, WAIT_S)
    except Exception:
        await asyncio.gather(*futures)  # a client's failure says more than the broken barrier
        raise
    await asyncio.sleep(warmup_s if fixed_window else 0)
    start = meter.snapshot()
    runs: list[ClientRun] = await asyncio.gather(*futures)
    end = meter.snapshot()
    started_at = min(run.started_at for run in runs)
    elapsed = max(run.finished_at for run in runs) - started_at
    latencies = [latency for run in runs for latency in run.latencies_s]
    measurement = measurement_of(
        elapsed,
        sum(run.operations for run in runs),
        sum(run.records for run in runs),
        latencies,
        sum(run.cpu_s for run in runs),
        start,
        end,
    )
    return measurement, latencies
