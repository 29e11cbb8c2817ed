"""Benchmarks: one command each, `python -m loadtests.bench.NAME [--quick]`; see loadtests/README.md."""
