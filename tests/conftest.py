"""Shared fixtures: one real tritonserver on models/, and one wheel, for the whole session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tooling import require_local_triton
from tests.venvs import Environment, build_wheel
from tritonscale.local.triton_server import LocalTriton


@pytest.fixture(scope="session")
def triton() -> Iterator[LocalTriton]:
    """A real tritonserver on the project's models/, every model loaded, free ports."""
    require_local_triton()
    with LocalTriton(http_port=0, grpc_port=0, metrics_port=0) as server:
        yield server


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's wheel, built once per session from the checkout."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def base_install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Environment:
    """A fresh environment with the wheel's base install (no extras): the operator's image."""
    return Environment.create(tmp_path_factory.mktemp("base") / "venv", str(wheel))
