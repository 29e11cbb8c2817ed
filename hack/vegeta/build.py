"""vegeta, an outside open-loop HTTP load generator, built from source into .tools/.

    python -m hack.vegeta.build      # prints the binary's path; a second run only finds it

vegeta (github.com/tsenart/vegeta/v12) is a Go command. The Go module beside this file
requires it at one release (tools.go keeps the requirement and its go.sum lines through
`go mod tidy`), and `go build` compiles it into .tools/vegeta-vX.Y.Z/vegeta, ignored by git:
one folder per release, so an upgrade never finds an older binary. Development tooling:
neither the wheel nor the operator's image carries it.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODULE_DIR = Path(__file__).resolve().parent
REPO_ROOT = MODULE_DIR.parents[1]
TOOLS_DIR = REPO_ROOT / ".tools"
PACKAGE = "github.com/tsenart/vegeta/v12"
# A cold build (modules downloaded, nothing cached) took 2.4 min on 2 busy cores, one with
# Go's caches warm 13 s: this limit only stops a build that hangs.
BUILD_TIMEOUT_S = 900


class VegetaBuildError(RuntimeError):
    """vegeta could not be built; one line for a person."""


def version() -> str:
    """The vegeta release go.mod requires, e.g. "v12.13.0"."""
    match = re.search(
        rf"^\s*(?:require\s+)?{re.escape(PACKAGE)}\s+(v\S+)",
        (MODULE_DIR / "go.mod").read_text(),
        re.MULTILINE,
    )
    if match is None:
        raise VegetaBuildError(f"no {PACKAGE} requirement in hack/vegeta/go.mod")
    return match.group(1)


def binary(tools_dir: Path = TOOLS_DIR) -> Path:
    return Path(tools_dir).resolve() / f"vegeta-{version()}" / "vegeta"


def _first_error(output: str) -> str:
    """The first line of go's output that is not a download notice."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if not line.startswith(("go: downloading", "go: extracting"))]
    return (errors or lines or ["no output"])[0]


def build(tools_dir: Path = TOOLS_DIR, progress: Callable[[str], Any] = print) -> Path:
    """The vegeta binary: built into TOOLS/vegeta-vX.Y.Z/ unless it is there already."""
    path = binary(tools_dir)
    if path.is_file():
        return path
    go = shutil.which("go")
    if go is None:
        raise VegetaBuildError("go not found on PATH: install Go 1.24 or newer to build vegeta")
    path.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time (two test workers, say); the other waits, then finds the binary.
    with open(path.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return path
        progress(f"building vegeta {version()} into {path.parent} with {go} ...")
        # A temporary name in the final folder, then an atomic rename: nobody ever runs a
        # half-written binary.
        partial = path.parent / f".vegeta.{os.getpid()}.partial"
        started = time.monotonic()
        try:
            done = subprocess.run(
                [
                    go,
                    "build",
                    "-trimpath",
                    # Stamp the release so that `vegeta -version` names it.
                    f"-ldflags=-s -w -X main.Version={version()}",
                    "-o",
                    str(partial),
                    PACKAGE,
                ],
                cwd=MODULE_DIR,
                # GOWORK off: a go.work above the checkout must not change what is built.
                env={**os.environ, "CGO_ENABLED": "0", "GOWORK": "off"},
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
            if done.returncode != 0:
                raise VegetaBuildError(
                    f"go build vegeta failed: {_first_error(done.stderr + done.stdout)}"
                )
            os.replace(partial, path)
        except subprocess.TimeoutExpired:
            raise VegetaBuildError(
                f"go build vegeta did not finish in {BUILD_TIMEOUT_S} s"
            ) from None
        finally:
            partial.unlink(missing_ok=True)
        progress(f"built vegeta in {time.monotonic() - started:.0f} s")
    return path


def main() -> int:
    try:
        print(build(progress=lambda line: print(line, file=sys.stderr)))
    except VegetaBuildError as error:
        print(f"hack/vegeta: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
