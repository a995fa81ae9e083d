"""Benchmark scripts (README, "Benchmarks"): run each as `uv run python benchmarks/NAME.py`.

A package so that scripts can share code by absolute import (`benchmarks.fb_table3`); the
controller harness they share lives in benchmarks/loopback_system.py.
"""
