"""Go commands the local cluster's tooling builds from the Go module proxy: `go_install` puts
one pinned release into a folder of its own under the tools folder, `GoTool` names such a
command once (CoreDNS, the registry, kube-router, kwok, vegeta), and `run_go` runs a long go
build with a progress line now and then.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hack.processes import ClusterError, dying_with_parent, first_error

PROGRESS_EVERY_S = 15.0


def run_go(
    command: list[str],
    cwd: Path,
    name: str,
    log: Path,
    progress: Callable[[str], Any],
    env: dict[str, str] | None = None,
) -> float:
    """Run a `go build -v` or `go install -v` COMMAND with a progress line every
    PROGRESS_EVERY_S; return the seconds it took, or raise ClusterError with go's error."""
    env = dict(os.environ, CGO_ENABLED="0", GOWORK="off", **(env or {}))
    started = time.monotonic()
    with open(log, "wb") as log_file:
        # Should we be killed, go dies too instead of building on for minutes.
        process = subprocess.Popen(
            dying_with_parent(command),
            cwd=cwd,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        next_report = started + PROGRESS_EVERY_S
        while process.poll() is None:
            time.sleep(0.5)
            if time.monotonic() >= next_report:
                next_report += PROGRESS_EVERY_S
                # Bare package paths are `-v`'s lines; the rest is downloads and messages.
                lines = log.read_text(errors="replace").splitlines()
                packages = [line for line in lines if line and " " not in line]
                downloads = sum(line.startswith("go: downloading") for line in lines)
                last = f" (last: {packages[-1]})" if packages else ""
                progress(
                    f"  {name}: {time.monotonic() - started:.0f} s, {downloads} modules "
                    f"downloaded, {len(packages)} packages compiled{last}"
                )
    finally:
        if process.poll() is None:  # interrupted: leave no go process behind
            process.kill()
            process.wait()
    if process.returncode != 0:
        raise ClusterError(
            f"go build {name} failed: {first_error(log.read_text(errors='replace'))}"
        )
    return time.monotonic() - started


def go_install(
    package: str, target: Path, progress: Callable[[str], Any], *, ldflags: str = "-s -w"
) -> Path:
    """`go install PACKAGE@VERSION` (the module's own go.mod and go.sum, checked against the
    checksum database) into the file `target`, or return at once when it is there.
    `ldflags` are the linker's flags (a command's `-X main.Version=...` stamp goes there)."""
    if target.is_file():
        return target
    go = shutil.which("go")
    if go is None:
        raise ClusterError(f"go not found on PATH: install Go to build {package}")
    name = target.name
    target.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time per target (two test workers, say); the others wait here and
    # then find the binary.
    with open(target.with_name(f".{name}.build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():
            return target
        progress(f"building {package} into {target.parent} (minutes cold, seconds cached)")
        with tempfile.TemporaryDirectory(prefix=f"tritonscale-{name}-build-") as scratch:
            command = [go, "install", "-v", "-trimpath", f"-ldflags={ldflags}", package]
            log = Path(scratch) / "build.log"
            seconds = run_go(command, Path(scratch), name, log, progress, env={"GOBIN": scratch})
            built = next(path for path in Path(scratch).iterdir() if path.name != "build.log")
            # Through a name in the final folder: nobody sees a half-written binary.
            partial = target.with_name(f".{name}.partial")
            shutil.copyfile(built, partial)
            partial.chmod(0o755)
            partial.replace(target)
    progress(f"built {name} in {seconds:.0f} s")
    return target


@dataclass(frozen=True)
class GoTool:
    """A pinned Go command the development tooling builds with `go_install` into
    TOOLS/NAME-VERSION/NAME (one folder per release, so an upgrade never finds an older
    binary), failing with `error`: one line for a person."""

    name: str
    package: str  # the command's package path, without @VERSION
    version: str
    ldflags: str
    error: type[Exception]

    def binary(self, tools_dir: Path) -> Path:
        return Path(tools_dir).resolve() / f"{self.name}-{self.version}" / self.name

    def build(self, tools_dir: Path, progress: Callable[[str], Any] = print) -> Path:
        """The binary: built unless it is there already."""
        try:
            return go_install(
                f"{self.package}@{self.version}",
                self.binary(tools_dir),
                progress,
                ldflags=self.ldflags,
            )
        except ClusterError as error:
            raise self.error(str(error)) from None

    def main(self, tools_dir: Path, prefix: str) -> int:
        """`python -m ...build`: print the binary's path, or `prefix: why` and exit 1."""
        try:
            print(self.build(tools_dir, progress=lambda line: print(line, file=sys.stderr)))
        except self.error as error:
            print(f"{prefix}: {error}", file=sys.stderr)
            return 1
        return 0
