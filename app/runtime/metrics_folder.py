"""The folder where the workers of one node (`serve --workers N`) keep their metrics, so that a scrape
answered by any of them shows the node's counters (prometheus-client's multiprocess mode: each
process writes its values to files of its own there, and a scrape sums them; app/api/metrics.py).

Invariants:
- One folder per node: PROMETHEUS_MULTIPROC_DIR when the user set it (prometheus-client's own
  variable), else one per user and listening address, so that two nodes on one host never add up
  each other's counters.
- Wiped when the node starts, before its first worker does: the files of the workers of a node
  that was SIGKILLed are never counted again (a restarted node counts from 0, which Prometheus
  reads as the reset it is), nor are those of a worker whose pid a new worker happens to reuse.
- Emptied again when the node stops (not after a SIGKILL: the next start does it).
- A worker that dies has its "live" gauges' files removed (forget_dead_worker) as soon as the
  supervisor sees it: a gauge summed over the live workers (the request pool's) drops its values.
- The supervisor sets PROMETHEUS_MULTIPROC_DIR for its workers before they start: prometheus-client
  chooses its mode once, when it is first imported.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead

MULTIPROCESS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


def _private_folder(path: Path) -> Path:
    """`path`, created if need be, refused unless it is a directory of ours that only we can write
    (in a shared /tmp another user could have created it first, to read or forge our metrics)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o022:
        raise RuntimeError(
            f"the metrics folder {path} is not a directory of this user that only it can write: remove it, or set "
            f"{MULTIPROCESS_DIR_VARIABLE} to a folder of this node's own"
        )
    return path


def node_metrics_folder(host: str, port: int) -> Path:
    """The node's folder, emptied of every worker's metric files (see the module's invariants)."""
    given = os.environ.get(MULTIPROCESS_DIR_VARIABLE)
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
    else:
        runtime = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
        folder = _private_folder(_private_folder(runtime / f"txbroker-{os.getuid()}") / f"metrics-{host}-{port}")
    empty_metrics_folder(folder)
    return folder


def empty_metrics_folder(folder: Path) -> None:
    for stale in folder.glob("*.db"):  # prometheus-client's files only: the folder may be the user's
        stale.unlink(missing_ok=True)


def forget_dead_worker(folder: Path, pid: int) -> None:
    """Drops the values of the "live" gauges of the worker `pid`, which has exited."""
    mark_process_dead(pid, str(folder))
