"""Shared fixtures: one real tritonserver on models/ for the whole test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.tooling import require_local_triton
from tritonscale.local.triton_server import LocalTriton


@pytest.fixture(scope="session")
def triton() -> Iterator[LocalTriton]:
    """A real tritonserver on the project's models/, every model loaded, free ports."""
    require_local_triton()
    with LocalTriton(http_port=0, grpc_port=0, metrics_port=0) as server:
        yield server
