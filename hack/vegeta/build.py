"""vegeta, an outside open-loop HTTP load generator, built from source into .tools/.

    python -m hack.vegeta.build      # prints the binary's path; a second run only finds it

vegeta (github.com/tsenart/vegeta/v12) is a Go command. hack.gotools.go_install builds it the
way it builds CoreDNS and the registry: `go install PACKAGE@VERSION`, with vegeta's own go.mod
and go.sum checked against the checksum database, into .tools/vegeta-vX.Y.Z/vegeta, ignored by
git: one folder per release, so an upgrade never finds an older binary. Development tooling:
neither the wheel nor the operator's image carries it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack.gotools import GoTool

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = REPO_ROOT / ".tools"
PACKAGE = "github.com/tsenart/vegeta/v12"
# A cold build (modules downloaded, nothing cached) took 2.4 min on 2 busy cores, one with
# Go's caches warm 13 s.
VERSION = "v12.13.0"


class VegetaBuildError(RuntimeError):
    """vegeta could not be built; one line for a person."""


# Stamped with the release, so that the binary's version command names it.
TOOL = GoTool("vegeta", PACKAGE, VERSION, f"-s -w -X main.Version={VERSION}", VegetaBuildError)


def binary(tools_dir: Path = TOOLS_DIR) -> Path:
    return TOOL.binary(tools_dir)


def build(tools_dir: Path = TOOLS_DIR, progress: Callable[[str], Any] = print) -> Path:
    """The vegeta binary: built into TOOLS/vegeta-vX.Y.Z/ unless it is there already."""
    return TOOL.build(tools_dir, progress)


if __name__ == "__main__":
    sys.exit(TOOL.main(TOOLS_DIR, "hack/vegeta"))
