"""Benchmarks for pgqueue; run each with ``python -m benchmarks.<name>`` from the repository root."""
