"""Metrics: the signals' PromQL, and the sources that turn Triton's counters into a snapshot."""
