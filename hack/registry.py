"""A local image registry for the cluster: distribution's `registry`, built from the Go module
proxy and run on 127.0.0.1 beside the node.

`build` installs github.com/distribution/distribution/v3/cmd/registry at REGISTRY_VERSION into
TOOLS/registry-vX.Y.Z/bin. hack.node starts it before containerd (its address goes into
containerd's registry hosts, plain HTTP on loopback) and stops it with the node; its storage is
STATE/node/registry, gone at `down`. `push` sends an OCI archive there with buildah, so a pod
can pull `127.0.0.1:PORT/NAME:TAG` the way it would from any registry.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack import images
from hack.gotools import go_install

REGISTRY_VERSION = "v3.1.2"
REGISTRY_PACKAGE = "github.com/distribution/distribution/v3/cmd/registry"


class RegistryError(RuntimeError):
    """The registry could not be built, started or pushed to; one line for a person."""


def binary(tools_dir: Path) -> Path:
    return Path(tools_dir).resolve() / f"registry-{REGISTRY_VERSION}" / "bin" / "registry"


def build(tools_dir: Path, progress: Callable[[str], Any] = print) -> Path:
    """The registry into TOOLS/registry-vX.Y.Z/bin, or at once when it is there."""
    return go_install(f"{REGISTRY_PACKAGE}@{REGISTRY_VERSION}", binary(tools_dir), progress)


def config(storage: Path, port: int, debug_port: int) -> dict[str, Any]:
    return {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
        # Loopback only: no traffic leaves the machine, and plain HTTP stays on it.
        "http": {"addr": f"127.0.0.1:{port}", "debug": {"addr": f"127.0.0.1:{debug_port}"}},
    }


def containerd_hosts(port: int) -> str:
    """containerd's hosts.toml for the registry (folder certs.d/127.0.0.1:PORT): plain HTTP."""
    return f"""\
server = "http://127.0.0.1:{port}"

[host."http://127.0.0.1:{port}"]
  capabilities = ["pull", "resolve"]
"""


def answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def push(archive: Path, reference: str) -> None:
    """Push an OCI archive to the registry as `reference` (127.0.0.1:PORT/NAME:TAG) with
    buildah, through storage of its own that is thrown away."""
    with images.throwaway_buildah(lambda line: RegistryError(f"{reference}: {line}")) as run:
        image_id = run("pull", "--quiet", f"oci-archive:{archive}").splitlines()[-1]
        run("push", "--quiet", "--tls-verify=false", image_id, f"docker://{reference}")


def write_config(folder: Path, port: int, debug_port: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "registry.yaml"
    # JSON is YAML.
    path.write_text(json.dumps(config(folder / "data", port, debug_port), indent=2) + "\n")
    return path
