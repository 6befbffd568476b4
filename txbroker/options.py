"""Clients' numeric options, checked when a client is made: a value that cannot work (no request in
flight allowed, a negative linger) is refused at once with a ValueError naming it, as Kafka's clients
refuse such a config (ConfigException), instead of a client that waits for good or fails later."""

from __future__ import annotations

from collections.abc import Mapping


def check_at_least(minimums: Mapping[str, int], values: Mapping[str, object]) -> None:
    """Each of `values` by its name must be a number (not a bool) of at least its name's minimum."""
    for name, minimum in minimums.items():
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
            raise ValueError(f"{name} is {value!r}: expected a number of at least {minimum}")
