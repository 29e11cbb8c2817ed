"""Running a built image as the chart runs it, with runc and no container engine.

An image's OCI archive (out/images/NAME.oci.tar) is unpacked into an OCI bundle (its layers
applied in order, whiteouts honoured) and run by runc with the chart's user, a read-only root
filesystem, no capabilities, no new privileges and /tmp as a writable tmpfs (the chart's
emptyDir). runc keeps its state in a folder of the test's own, so a colleague's runc or
containerd never sees these containers.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import secrets
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


@dataclass
class Layer:
    digest: str
    size_bytes: int  # uncompressed


@dataclass
class Bundle:
    """An OCI bundle: rootfs/ plus what the image's config says about running it."""

    path: Path
    config: dict[str, Any]
    layers: list[Layer] = field(default_factory=list)

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"

    @property
    def size_bytes(self) -> int:
        return sum(layer.size_bytes for layer in self.layers)


def _blob(tar: tarfile.TarFile, digest: str) -> IO[bytes]:
    member = tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1])
    assert member is not None, f"blob {digest} missing from the archive"
    return member


def _apply_whiteout(rootfs: Path, member: tarfile.TarInfo) -> bool:
    """Delete what a whiteout member deletes; False for any other member."""
    parent, _, name = member.name.rpartition("/")
    if name == OPAQUE:
        folder = rootfs / parent
        if folder.is_dir():
            for entry in folder.iterdir():
                _remove(entry)
        return True
    if name.startswith(WHITEOUT):
        _remove(rootfs / parent / name[len(WHITEOUT) :])
        return True
    return False


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def unpack(archive: Path, into: Path) -> Bundle:
    """The one image of an OCI archive as a bundle in `into` (root: owners are kept)."""
    bundle = Bundle(into, {})
    bundle.rootfs.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = json.load(_blob(tar, index["manifests"][0]["digest"]))
        bundle.config = json.load(_blob(tar, manifest["config"]["digest"]))
        for layer in manifest["layers"]:
            raw = _blob(tar, layer["digest"])
            compressed = "gzip" in layer["mediaType"]
            stream = gzip.GzipFile(fileobj=raw) if compressed else raw
            with tarfile.open(fileobj=stream, mode="r|") as layer_tar:
                # A streamed tar is read once: whiteouts are applied member by member, which
                # is right because a layer never holds both a whiteout and its target.
                size = 0
                for member in layer_tar:
                    size += member.size
                    if _apply_whiteout(bundle.rootfs, member):
                        continue
                    # A lower layer's file or link is replaced, never written through.
                    target = bundle.rootfs / member.name
                    if not (member.isdir() and target.is_dir() and not target.is_symlink()):
                        _remove(target)
                    layer_tar.extract(member, bundle.rootfs, numeric_owner=True)
            bundle.layers.append(Layer(layer["digest"], size))
    return bundle


def runc_spec(
    bundle: Bundle,
    args: list[str],
    *,
    user: tuple[int, int],
    host_network: bool = False,
    binds: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A runc config as the chart's pods run: its user, read-only root, /tmp writable."""
    done = subprocess.run(
        ["runc", "spec", "--bundle", str(bundle.path)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    spec_path = bundle.path / "config.json"
    spec = json.loads(spec_path.read_text())
    image = bundle.config.get("config", {})
    process = spec["process"]
    process["terminal"] = False
    process["user"] = {"uid": user[0], "gid": user[1]}
    process["args"] = args
    process["env"] = image.get("Env", [])
    process["cwd"] = image.get("WorkingDir") or "/"
    # The chart drops every capability and forbids privilege escalation.
    process["capabilities"] = {key: [] for key in process["capabilities"]}
    process["noNewPrivileges"] = True
    spec["root"] = {"path": "rootfs", "readonly": True}
    spec["mounts"].append(
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", "mode=1777", "size=256m"],
        }
    )
    for source, destination in (binds or {}).items():
        spec["mounts"].append(
            {
                "destination": destination,
                "type": "bind",
                "source": source,
                "options": ["rbind", "ro"],
            }
        )
    if host_network:
        spec["linux"]["namespaces"] = [
            ns for ns in spec["linux"]["namespaces"] if ns["type"] != "network"
        ]
    spec_path.write_text(json.dumps(spec, indent=2))
    return spec


@dataclass
class Started:
    name: str
    process: subprocess.Popen[bytes]


@dataclass
class Runc:
    """runc with its state in `state` (not /run/runc, which other tools on the machine use)."""

    state: Path

    def command(self, *args: str) -> list[str]:
        return ["runc", "--root", str(self.state), *args]

    def run(self, bundle: Bundle, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the bundle's process to its end; a hang fails naming the container's command."""
        name = f"tritonscale-test-{secrets.token_hex(4)}"
        try:
            return subprocess.run(
                self.command("run", "--bundle", str(bundle.path), name),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"container {name} ({' '.join(_args(bundle))}) hung: "
                f"still running after {timeout_s:.0f} s"
            ) from None
        finally:
            self.delete(name)

    @contextlib.contextmanager
    def started(self, bundle: Bundle, log: Path) -> Iterator[Started]:
        """The bundle's process running in the background, its output in `log`; on exit it
        gets SIGTERM, then SIGKILL if still there after 30 s, and the container is deleted."""
        name = f"tritonscale-test-{secrets.token_hex(4)}"
        with open(log, "wb") as output:
            process = subprocess.Popen(
                self.command("run", "--bundle", str(bundle.path), name),
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            try:
                yield Started(name, process)
            finally:
                subprocess.run(self.command("kill", name, "TERM"), capture_output=True, timeout=30)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    subprocess.run(
                        self.command("kill", name, "KILL"), capture_output=True, timeout=30
                    )
                    process.wait(timeout=30)
                self.delete(name)

    def exec(
        self, name: str, args: list[str], user: tuple[int, int], timeout_s: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """A second process in a running container (as a kubelet's exec probe runs one)."""
        try:
            return subprocess.run(
                self.command("exec", "--user", f"{user[0]}:{user[1]}", name, *args),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"`{' '.join(args)}` in container {name} hung: no exit in {timeout_s:.0f} s"
            ) from None

    def delete(self, name: str) -> None:
        subprocess.run(self.command("delete", "--force", name), capture_output=True, timeout=60)


def _args(bundle: Bundle) -> list[str]:
    spec = json.loads((bundle.path / "config.json").read_text())
    return list(spec["process"]["args"])
