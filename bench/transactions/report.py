"""The transaction benchmark's table: one row per result, beside its baseline measured in the same run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    section: str
    scenario: str
    result: str
    baseline: str = "-"
    ratio: str = "-"
    cpu_percent: str = "-"  # server / postgres / client / everything else, % of one core
    cpu_ms_per_op: str = "-"  # server / postgres


def format_table(rows: list[Row]) -> str:
    headers = ("#", "scenario", "result", "baseline (same run)", "ratio", "CPU% srv/pg/cli/other", "CPU ms/op srv/pg")
    cells = [(r.section, r.scenario, r.result, r.baseline, r.ratio, r.cpu_percent, r.cpu_ms_per_op) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
    out = [line(headers), "  ".join("-" * w for w in widths)]
    previous = None
    for c in cells:
        if previous is not None and c[0] != previous:
            out.append("")
        out.append(line(c))
        previous = c[0]
    return "\n".join(out)
