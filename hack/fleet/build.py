"""kwok, Kubernetes nodes and pods without kubelets, built from source into .tools/.

    python -m hack.fleet.build      # prints the binary's path; a second run only finds it

kwok (sigs.k8s.io/kwok) is a Go command. hack.gotools.go_install builds it the way it builds
vegeta and the registry: `go install PACKAGE@VERSION`, with kwok's own go.mod and go.sum
checked against the checksum database, into .tools/kwok-vX.Y.Z/kwok, ignored by git.
Development tooling: neither the wheel nor the operator's image carries it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack import cluster
from hack.gotools import GoTool
from hack.processes import ClusterError

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = REPO_ROOT / ".tools"
PACKAGE = "sigs.k8s.io/kwok/cmd/kwok"
VERSION = "v0.8.0"


class KwokBuildError(RuntimeError):
    """kwok could not be built; one line for a person."""


# Stamped with the release, so that the binary's version command names it.
TOOL = GoTool(
    "kwok",
    PACKAGE,
    VERSION,
    f"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version={VERSION}",
    KwokBuildError,
)


def binary(tools_dir: Path = TOOLS_DIR) -> Path:
    return TOOL.binary(tools_dir)


def build(tools_dir: Path = TOOLS_DIR, progress: Callable[[str], Any] = print) -> Path:
    """The kwok binary: built into TOOLS/kwok-vX.Y.Z/ unless it is there already."""
    return TOOL.build(tools_dir, progress)


def build_before_namespace(
    tools_dir: Path = TOOLS_DIR, progress: Callable[[str], Any] = print
) -> None:
    """kwok and the control plane, built (or found) before a fleet enters its network
    namespace (hack.fleet.netns), which has no route to the Go module proxy. A build that
    fails ends the process with its one-line reason."""
    try:
        cluster.build(tools_dir, progress)
        build(tools_dir, progress)
    except (ClusterError, KwokBuildError) as error:
        raise SystemExit(f"fleet: {error}") from None


if __name__ == "__main__":
    sys.exit(TOOL.main(TOOLS_DIR, "hack/fleet"))
