"""Fault injection for the tests of the exactly-once sink: the crashes the commit protocol must
survive, at the instants that matter. Not a public option: off unless the write has the option
`_test_faults`, a JSON object

    {"fail": [{"partition": 1, "at": "after_prepare", "batch": 2, "attempts": "first"}],
     "crash_driver_after_decision": 3}

- `fail`: the task of that partition (of that streaming batch id; any batch when absent) ends its
  Python worker with os._exit -- as a lost executor would, so no Python code runs after it -- at
  `before_write`, `mid_write` (after the first Arrow batch of rows was sent and acknowledged: an
  Ongoing transaction is left behind) or `after_prepare` (a Prepared one is). On the first attempt
  only (`"attempts": "first"`, the default), or on every attempt (`"all"`: the job fails).
- `pause`: {"at": <point>, "dir": <directory>, "batch": <batch id, optional>}: the first task
  attempts (or the driver) to reach that point create `<dir>/<point>.reached` and wait (up to 300 s)
  until `<dir>/<point>.go` exists, once only (a point reached after the go file exists runs on):
  a test does what it wants the protocol to meet there -- stops the server or its PostgreSQL --
  then lets it go on. Points: the tasks' `before_write`, `mid_write`, `before_prepare` (the rows
  written, the transaction still Ongoing), `after_prepare`; the driver's `before_decision` (every
  task prepared) and `after_decision` (recorded, nothing committed yet).
- `crash_driver_after_decision`: after the driver recorded the decision for that batch id (0 for a
  batch write) and committed the first of its transactions, the driver's JVM and Python process are
  SIGKILLed, as a machine crash would. Only in a driver that opted in by exporting
  TXBROKER_SPARK_TEST_DRIVER_PID=<its pid> before starting Spark: this never kills a process that
  did not ask for it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

POINTS = ("before_write", "mid_write", "after_prepare")
PAUSE_POINTS = (*POINTS, "before_prepare", "before_decision", "after_decision")
PAUSE_BOUND_S = 300
DRIVER_PID_VARIABLE = "TXBROKER_SPARK_TEST_DRIVER_PID"


@dataclass(frozen=True)
class TaskFault:
    partition: int
    at: str
    batch: int | None = None
    every_attempt: bool = False

    def applies(self, at: str, batch_id: int, partition: int, attempt: int) -> bool:
        return (
            at == self.at
            and partition == self.partition
            and (self.batch is None or self.batch == batch_id)
            and (self.every_attempt or attempt == 0)
        )


@dataclass(frozen=True)
class Pause:
    at: str
    directory: str
    batch: int | None = None

    def wait(self, at: str, batch_id: int) -> None:
        if at != self.at or (self.batch is not None and self.batch != batch_id):
            return
        go = Path(self.directory, f"{at}.go")
        if go.exists():
            return
        Path(self.directory, f"{at}.reached").touch()
        deadline = time.monotonic() + PAUSE_BOUND_S
        while not go.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"_test_faults: paused at {at} for {PAUSE_BOUND_S}s, and {go} never appeared")
            time.sleep(0.05)


@dataclass(frozen=True)
class Faults:
    tasks: tuple[TaskFault, ...] = ()
    crash_driver_after_decision: int | None = None
    pause: Pause | None = None

    @classmethod
    def parse(cls, text: str | None) -> Faults:
        if not text:
            return cls()
        spec = json.loads(text)
        tasks = []
        for entry in spec.get("fail", []):
            if entry["at"] not in POINTS:
                raise ValueError(f"_test_faults: 'at' must be one of {POINTS}, not {entry['at']!r}")
            tasks.append(
                TaskFault(
                    int(entry["partition"]), entry["at"], entry.get("batch"), entry.get("attempts", "first") == "all"
                )
            )
        crash = spec.get("crash_driver_after_decision")
        pause = spec.get("pause")
        if pause is not None and pause["at"] not in PAUSE_POINTS:
            raise ValueError(f"_test_faults: pause 'at' must be one of {PAUSE_POINTS}, not {pause['at']!r}")
        return cls(
            tuple(tasks),
            None if crash is None else int(crash),
            None if pause is None else Pause(pause["at"], pause["dir"], pause.get("batch")),
        )

    def point(self, at: str, batch_id: int) -> None:
        """Called by a task or the driver at each point: waits there while a pause asks it to."""
        if self.pause is not None:
            self.pause.wait(at, batch_id)

    def task_point(self, at: str, batch_id: int, partition: int, attempt: int) -> None:
        """Called by a task at each point; ends the worker process where a fault is planned."""
        self.point(at, batch_id)
        if any(fault.applies(at, batch_id, partition, attempt) for fault in self.tasks):
            os._exit(17)

    def crashes_after_decision(self, batch_id: int) -> bool:
        return self.crash_driver_after_decision == batch_id


def crash_driver() -> None:
    """SIGKILLs the Spark driver this process works for (its JVM, then its Python process), then
    ends this process: nothing of the driver runs after the decision was recorded."""
    driver_pid = int(os.environ[DRIVER_PID_VARIABLE])  # KeyError: the driver did not opt in
    jvm_pid = _ancestor_named("java")
    if jvm_pid is None or _parent(jvm_pid) != driver_pid:
        raise RuntimeError(f"crash_driver: no JVM child of driver {driver_pid} among this process's ancestors")
    os.kill(jvm_pid, signal.SIGKILL)
    os.kill(driver_pid, signal.SIGKILL)
    os._exit(17)


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _ancestor_named(name: str) -> int | None:
    pid = os.getpid()
    while pid > 1:
        pid = _parent(pid)
        if Path(f"/proc/{pid}/comm").read_text().strip() == name:
            return pid
    return None


__all__ = ["DRIVER_PID_VARIABLE", "Faults", "Pause", "TaskFault", "crash_driver"]
