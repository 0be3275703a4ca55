"""Benchmarks: side-by-side speed and memory measurements (run from the repository root)."""
