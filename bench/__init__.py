"""Benchmarks of txbroker; see bench/README.md."""
