"""The console's offsets-per-second figures (a display aid kept in memory, per server process:
nothing depends on it)."""

from __future__ import annotations

from collections import deque

from fastapi import Request


class ThroughputMeter:
    """Offsets appended per second, from a topic's summed high watermarks sampled whenever a page
    shows them (kept in memory: a display aid, nothing depends on it). The rate is taken against the
    oldest sample of the last `window_s` seconds, so it needs two looks at least `min_span_s` apart."""

    def __init__(self, window_s: float = 60, min_span_s: float = 2, max_keys: int = 10_000) -> None:
        self.window_s = window_s
        self.min_span_s = min_span_s
        self.max_keys = max_keys
        self.samples: dict[object, deque[tuple[float, int]]] = {}

    def rate(self, key: object, high_watermark: int, at_s: float) -> float | None:
        samples = self.samples.get(key)
        if samples is None:
            if len(self.samples) >= self.max_keys:
                self.samples.clear()
            samples = self.samples[key] = deque()
        while samples and (at_s - samples[0][0] > self.window_s or samples[0][1] > high_watermark):
            samples.popleft()  # too old, or the topic was re-created with a lower watermark
        if not samples or at_s - samples[-1][0] >= 1:
            samples.append((at_s, high_watermark))
        first_at, first_hw = samples[0]
        if at_s - first_at < self.min_span_s:
            return None
        return (high_watermark - first_hw) / (at_s - first_at)


def meter_of(request: Request) -> ThroughputMeter:
    state = request.app.state
    if not hasattr(state, "console_throughput"):
        state.console_throughput = ThroughputMeter()
    return state.console_throughput
