"""Many independent runs shared among forked processes, their results in the runs' order.

The simulator's scenarios and traces hold mapping proxies, which do not pickle: the function
that runs one (and what it reads) is set before the fork and inherited by every process, and
only the index of a run and its result (JSON-ready rows) travel between them. The result is
the same for any number of jobs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
from collections.abc import Callable, Iterator
from typing import Any

# Two processes by default, one on a machine with a single CPU.
DEFAULT_JOBS = min(2, os.cpu_count() or 1)

# What a forked job runs, set before the fork.
_JOB: dict[str, Callable[[int], Any]] = {}


def in_order(run: Callable[[int], Any], count: int, jobs: int, chunksize: int = 1) -> Iterator[Any]:
    """run(0), run(1)... run(count - 1), in that order; on `jobs` forked processes when more
    than one, `chunksize` indices handed to a process at a time."""
    _JOB.clear()
    _JOB["run"] = run
    if jobs == 1:
        yield from map(run, range(count))
        return
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        yield from pool.imap(_run, range(count), chunksize=chunksize)


def _run(index: int) -> Any:
    return _JOB["run"](index)


def add_jobs_argument(parser: argparse.ArgumentParser, runs: str) -> None:
    """`--jobs`: how many processes share the `runs` (at least 1)."""
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=DEFAULT_JOBS,
        help=f"processes that run the {runs} (default: 2, or 1 on one CPU)",
    )


def positive_int(text: str) -> int:
    count = int(text)
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {count}")
    return count
