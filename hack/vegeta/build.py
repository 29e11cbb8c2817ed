"""vegeta, an outside open-loop HTTP load generator, built from source into .tools/.

    python -m hack.vegeta.build      # prints the binary's path; a second run only finds it

vegeta (github.com/tsenart/vegeta/v12) is a Go command. hack.cluster.go_install builds it the
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

from hack import cluster

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = REPO_ROOT / ".tools"
PACKAGE = "github.com/tsenart/vegeta/v12"
# A cold build (modules downloaded, nothing cached) took 2.4 min on 2 busy cores, one with
# Go's caches warm 13 s.
VERSION = "v12.13.0"


class VegetaBuildError(RuntimeError):
    """vegeta could not be built; one line for a person."""


def binary(tools_dir: Path = TOOLS_DIR) -> Path:
    return Path(tools_dir).resolve() / f"vegeta-{VERSION}" / "vegeta"


def build(tools_dir: Path = TOOLS_DIR, progress: Callable[[str], Any] = print) -> Path:
    """The vegeta binary: built into TOOLS/vegeta-vX.Y.Z/ unless it is there already."""
    try:
        return cluster.go_install(
            f"{PACKAGE}@{VERSION}",
            binary(tools_dir),
            progress,
            # Stamp the release so that `vegeta -version` names it.
            ldflags=f"-s -w -X main.Version={VERSION}",
        )
    except cluster.ClusterError as error:
        raise VegetaBuildError(str(error)) from None


def main() -> int:
    try:
        print(build(progress=lambda line: print(line, file=sys.stderr)))
    except VegetaBuildError as error:
        print(f"hack/vegeta: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
