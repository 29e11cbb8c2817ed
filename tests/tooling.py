"""Finding the real tools tests need; in CI a missing tool is a failure, never a skip."""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(reason: str) -> None:
    """Skip on a developer's machine, fail in CI, where every tool must be installed."""
    if in_ci():
        pytest.fail(f"{reason} (CI must install it: see Makefile's deps target)", pytrace=False)
    pytest.skip(reason)


def require_tool(name: str) -> str:
    """The path of an executable on PATH, or skip/fail with a clear reason."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} not found on PATH")
    return path


def require_local_triton() -> None:
    """The tritonserver of the `server` extra, with a Python backend stub for this Python."""
    from tritonscale.local.triton_server import LocalTritonError, TritonInstall

    try:
        TritonInstall()
    except LocalTritonError as error:
        missing(str(error))
