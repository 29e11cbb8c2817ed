"""Kubernetes from upstream sources: the release that controlplane/go.mod requires, and its
binaries built from that module.

`controlplane/` next to this file is a tiny Go module that requires k8s.io/kubernetes at one
release (and the k8s.io staging modules at the matching v0.x versions, as k/k's own go.mod
replaces them), plus etcd at the version k/k pins. `build` compiles etcd, kube-apiserver,
kube-controller-manager and the node's kube-scheduler, kube-proxy and kubelet from it into
TOOLS/kubernetes-vX.Y.Z/bin.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack.gotools import run_go
from hack.processes import ClusterError

GO_MODULE_DIR = Path(__file__).resolve().parent / "controlplane"
# Binary name -> Go package, as `go build` takes it from inside GO_MODULE_DIR.
PACKAGES = {
    "etcd": "./etcd",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    # The node's (hack.node): the same module, so the same versions and build cache.
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
}


def kubernetes_version() -> str:
    """The k8s.io/kubernetes release that controlplane/go.mod requires, e.g. "v1.34.4"."""
    match = re.search(
        r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)",
        (GO_MODULE_DIR / "go.mod").read_text(),
        re.MULTILINE,
    )
    if match is None:
        raise ClusterError(f"no k8s.io/kubernetes requirement in {GO_MODULE_DIR / 'go.mod'}")
    return match.group(1)


def bin_dir(tools_dir: Path) -> Path:
    """Where `build` puts the binaries: one folder per release, so upgrades never mix."""
    return Path(tools_dir).resolve() / f"kubernetes-{kubernetes_version()}" / "bin"


def binaries(tools_dir: Path) -> dict[str, Path]:
    return {name: bin_dir(tools_dir) / name for name in PACKAGES}


def _ldflags(version: str) -> str:
    """Strip symbols, and stamp the release the way k/k's hack/lib/version.sh does, so
    `kubectl version` shows it instead of v0.0.0-master. (The module zip has no git
    commit to stamp: /version shows gitCommit "$Format:%H$".)"""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
        ]
    return " ".join(flags)


def _copy_module(into: Path) -> Path:
    """A writable copy of the Go module: the package folder may be read-only when installed,
    and go may want to touch go.mod/go.sum."""
    target = into / "controlplane"
    for source in GO_MODULE_DIR.rglob("*"):
        if source.is_file() and (source.suffix == ".go" or source.name in ("go.mod", "go.sum")):
            destination = target / source.relative_to(GO_MODULE_DIR)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
    return target


def _go_build(
    go: str, module: Path, name: str, output: Path, log: Path, progress: Callable[[str], Any]
) -> float:
    """Build one binary into `output`; return the seconds it took."""
    version = kubernetes_version()
    command = [
        go,
        "build",
        "-v",  # one line per compiled package: the progress lines count them
        "-mod=mod",  # go.sum is complete; this lets another go version add what it wants
        "-trimpath",
        # k/k's release flags: static, no debug info, and the tags hack/lib/golang.sh uses.
        "-tags=selinux,notest,grpcnotrace",
        f"-ldflags={_ldflags(version)}",
        "-o",
        str(output),
        PACKAGES[name],
    ]
    return run_go(command, module, name, log, progress)


def build(tools_dir: Path, progress: Callable[[str], Any] = print) -> dict[str, Path]:
    paths = binaries(tools_dir)
    if all(path.is_file() for path in paths.values()):
        return paths
    go = shutil.which("go")
    if go is None:
        raise ClusterError("go not found on PATH: install Go 1.24 or newer to build Kubernetes")
    target = bin_dir(tools_dir)
    target.mkdir(parents=True, exist_ok=True)
    # One builder at a time per release; the others wait here and then find the binaries.
    with open(target / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [name for name, path in paths.items() if not path.is_file()]
        if not missing:
            return paths
        progress(
            f"building Kubernetes {kubernetes_version()} ({', '.join(missing)}) into {target}; "
            "on 2 cores a cold build takes 10 to 25 minutes, a cached one under a minute"
        )
        with tempfile.TemporaryDirectory(prefix="tritonscale-k8s-build-") as scratch:
            module = _copy_module(Path(scratch))
            for name in missing:
                # A temporary name in the final folder, then an atomic rename: nobody
                # ever sees a half-written binary.
                partial = target / f".{name}.{os.getpid()}.partial"
                try:
                    seconds = _go_build(
                        go, module, name, partial, Path(scratch) / f"{name}.log", progress
                    )
                    os.replace(partial, paths[name])
                finally:
                    partial.unlink(missing_ok=True)
                size_mb = paths[name].stat().st_size / 2**20
                progress(f"built {name} in {seconds:.0f} s ({size_mb:.0f} MiB)")
    return paths
