"""Benchmarks of pldlib (run ``python -m benchmarks.run``; report in results/BENCHMARKS.md)."""
