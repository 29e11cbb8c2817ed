"""Build, cache and push the project's images: `make base-image`, `make images`, `make push`.

    python -m hack.images base                 # the python:3.11-slim stand-in (buildah only)
    python -m hack.images build                # the three images, each also an OCI archive
    python -m hack.images push REGISTRY        # e.g. 127.0.0.1:5000/tritonscale

Where `docker info` works, Docker builds the images on the Dockerfiles' pinned
python:3.11-slim. Elsewhere buildah builds them, daemonless, on a stand-in for that image
made from Debian 12's packages with debootstrap (Docker Hub need not be reachable), kept in
buildah's storage as localhost/tritonscale-python:3.11-slim.

Each image is labelled with a key: a hash of its Dockerfile, the files it copies, the base
image's name and its id. A build whose key matches the image in storage and its
archive under out/images/ is skipped, so a second `make images` takes seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

REPO_ROOT = Path(__file__).resolve().parents[1]
OUT = REPO_ROOT / "out" / "images"
DEBOOTSTRAP_CACHE = REPO_ROOT / "out" / "cache" / "debootstrap"
KEY_LABEL = "io.tritonscale.build-key"

BASE_IMAGE = "localhost/tritonscale-python:3.11-slim"
# Debian 12's python3 is 3.11, the Python of python:3.11-slim. python-is-python3 and
# python3-pip give the `python` and `pip` commands the Dockerfiles call; libpython3.11 is the
# shared library the Triton Python backend stub links (the official image has it too); minbase
# brings passwd (groupadd, useradd) and apt.
BASE_SUITE = "bookworm"
BASE_PACKAGES = (
    "python3.11",
    "python3.11-venv",
    "python3-pip",
    "python-is-python3",
    "libpython3.11",
    "ca-certificates",
)
# What the base removes after debootstrap: package lists and caches, documentation and message
# translations (33 MB; Debian's slim images leave them out too). debconf's database stays:
# apt-get install in an image built on this one needs it.
BASE_CLEANUP = (
    "var/lib/apt/lists",
    "var/cache/apt",
    "var/log",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
)
# Bump to rebuild the base when how it is made changes in a way the key does not see.
BASE_RECIPE = 1

# A step that prints nothing for this long is taken as hung (the longest silent step seen on 2
# busy cores: pip installing and byte-compiling the operator's environment, about 40 s); a
# whole build may take this long.
IDLE_TIMEOUT_S = 300
BUILD_TIMEOUT_S = 40 * 60


@dataclass(frozen=True)
class Image:
    name: str
    dockerfile: str

    def local_name(self, version: str) -> str:
        return f"localhost/{self.name}:{version}"

    @property
    def archive(self) -> Path:
        return OUT / f"{self.name}.oci.tar"

    @property
    def record(self) -> Path:
        """The archive's key, layer count and sizes, written after the archive itself."""
        return OUT / f"{self.name}.oci.json"


IMAGES = (
    Image("tritonscale-operator", "operator/Dockerfile"),
    Image("tritonscale-locust", "loadtests/Dockerfile"),
    Image("tritonscale-triton-cpu", "triton/Dockerfile"),
)


class ImageError(RuntimeError):
    """A build or push failed; the message is one line for a person."""


def chart_version() -> str:
    """The chart's appVersion: the tag of every image."""
    chart = (REPO_ROOT / "charts" / "tritonscale" / "Chart.yaml").read_text()
    found = re.search(r'^appVersion:\s*"?([^"\n]+?)"?\s*$', chart, re.MULTILINE)
    if found is None:
        raise ImageError("charts/tritonscale/Chart.yaml has no appVersion")
    return found.group(1)


# ---- running tools ----------------------------------------------------------------------


def run(command: list[str], *, timeout_s: float = 120, env: dict[str, str] | None = None) -> str:
    """A short command's output; a failure or a hang is one line naming the command."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        raise ImageError(f"`{' '.join(command)}` hung: no answer in {timeout_s:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise ImageError(f"`{' '.join(command[:3])} ...` failed ({done.returncode}): {last}")
    return done.stdout


def stream(command: list[str], what: str, *, env: dict[str, str] | None = None) -> None:
    """Run a long step, printing its output as it comes with the time elapsed.

    The step is killed, and named, when it prints nothing for IDLE_TIMEOUT_S or runs longer
    than BUILD_TIMEOUT_S: a stuck download or build fails in minutes, not at CI's timeout.
    """
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # its own group: killing it takes buildah's children too
    )
    lines: queue.Queue[bytes | None] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    last = ""
    hung = None
    while True:
        try:
            line = lines.get(timeout=IDLE_TIMEOUT_S)
        except queue.Empty:
            hung = f"printed nothing for {IDLE_TIMEOUT_S} s"
            break
        if line is None:
            break
        elapsed = time.monotonic() - started
        text = line.decode(errors="replace").rstrip()
        if text:
            last = text
            print(f"  [{what} {int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {text}", flush=True)
        if elapsed > BUILD_TIMEOUT_S:
            hung = f"ran longer than {BUILD_TIMEOUT_S // 60} min"
            break
    if hung is not None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise ImageError(f"{what} hung: it {hung} (last line: {last[:200]!r})")
    if process.wait() != 0:
        raise ImageError(f"{what} failed ({process.returncode}): {last[:300]}")


def docker_engine() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


@contextlib.contextmanager
def throwaway_buildah(fail: Callable[[str], Exception]) -> Iterator[Callable[..., str]]:
    """`run(*args)`: buildah (vfs storage, chroot isolation, no daemon) on storage of its own,
    thrown away at the end; it returns buildah's output, and a failure raises `fail(line)`.
    For the node's own small images and pushes, which must not touch the shared storage."""
    with tempfile.TemporaryDirectory(prefix="tritonscale-buildah-") as scratch:
        command = ["buildah", f"--root={scratch}/storage", f"--runroot={scratch}/run",
                   "--storage-driver=vfs"]  # fmt: skip
        env = dict(os.environ, STORAGE_DRIVER="vfs", BUILDAH_ISOLATION="chroot")

        def run(*args: str) -> str:
            done = subprocess.run(
                [*command, *args], capture_output=True, text=True, timeout=120, env=env
            )
            if done.returncode != 0:
                raise fail(f"buildah {' '.join(args[:2])} failed: {done.stderr.strip()}")
            return done.stdout.strip()

        yield run


def buildah() -> list[str]:
    """The buildah command line, with the storage driver of STORAGE_DRIVER when it is set
    (vfs where the kernel refuses overlay mounts), buildah's own default otherwise."""
    path = shutil.which("buildah")
    if path is None:
        raise ImageError(
            "make images needs a Docker engine (`docker info` failed) or buildah "
            "(apt-get install buildah; `make deps` installs it)"
        )
    driver = os.environ.get("STORAGE_DRIVER")
    return [path, f"--storage-driver={driver}"] if driver else [path]


def build_trust_volumes(into: Path) -> list[str]:
    """Volumes that let a build's RUN steps trust what this machine's pip trusts.

    Where pip is told to trust a CA bundle of the machine's (PIP_CERT or /etc/pip.conf's
    `cert`, as behind a TLS-inspecting proxy), pip inside the build would reject PyPI's
    certificate: the bundle and a pip.conf naming it are mounted read-only into every RUN
    step. Volumes are not committed: nothing of the machine's trust ends up in an image.
    """
    cert = os.environ.get("PIP_CERT", "")
    config = Path("/etc/pip.conf")
    if not cert and config.is_file():
        found = re.search(r"^\s*cert\s*=\s*(\S+)", config.read_text(), re.MULTILINE)
        cert = found.group(1) if found else ""
    if not cert or not Path(cert).is_file():
        return []
    inside = "/etc/ssl/certs/ca-certificates.crt"  # present in both bases, so no new file
    pip_conf = into / "pip.conf"
    pip_conf.write_text(f"[global]\ncert = {inside}\n")
    return ["--volume", f"{cert}:{inside}:ro", "--volume", f"{pip_conf}:/etc/pip.conf:ro"]


def buildah_env() -> dict[str, str]:
    # chroot isolation: no user namespaces or runc needed to RUN a step, as in CI containers.
    return {**os.environ, "BUILDAH_ISOLATION": os.environ.get("BUILDAH_ISOLATION", "chroot")}


# ---- keys -------------------------------------------------------------------------------


def digest(*parts: bytes) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(hashlib.sha256(part).digest())
    return hasher.hexdigest()


def copied_files(dockerfile: Path) -> list[Path]:
    """Every file the Dockerfile's COPY and ADD instructions take from the build context."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    files: list[Path] = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        if any(word.startswith("--from=") for word in words[1:]):
            continue
        sources = [word for word in words[1:-1] if not word.startswith("--")]
        for source in sources:
            path = REPO_ROOT / source
            if path.is_dir():
                files += sorted(
                    p
                    for p in path.rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
                )
            elif path.is_file():
                files.append(path)
            else:
                raise ImageError(f"{dockerfile.relative_to(REPO_ROOT)} copies {source}: not found")
    return files


# The pinned base of a Dockerfile's FROM (not a FROM that names an earlier stage).
PINNED_FROM = re.compile(r"^(FROM[ \t]+)(python:\S+@sha256:[0-9a-f]{64})\b", re.MULTILINE)


def rebased(dockerfile_text: str, base: str) -> str:
    """The Dockerfile with every FROM of its pinned base naming `base` instead (the stand-in,
    or PYTHON_IMAGE): the reference is written out in each FROM, where Dependabot reads it."""
    text, count = PINNED_FROM.subn(lambda match: match.group(1) + base, dockerfile_text)
    if count == 0:
        raise ImageError("no FROM python:...@sha256:... to replace with the base " + base)
    return text


def image_key(image: Image, base: str, base_id: str) -> str:
    dockerfile = REPO_ROOT / image.dockerfile
    parts = [dockerfile.read_bytes(), (REPO_ROOT / ".dockerignore").read_bytes()]
    parts += [base.encode(), base_id.encode()]
    for path in copied_files(dockerfile):
        parts += [str(path.relative_to(REPO_ROOT)).encode(), path.read_bytes()]
    return digest(*parts)


def base_key() -> str:
    mirror = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
    recipe = {
        "suite": BASE_SUITE,
        "packages": BASE_PACKAGES,
        "cleanup": BASE_CLEANUP,
        "mirror": mirror,
        "recipe": BASE_RECIPE,
    }
    return digest(json.dumps(recipe, sort_keys=True).encode())


# ---- image storage ----------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """An image as the engine's storage has it."""

    id: str
    key: str


def stored_buildah(name: str) -> Stored | None:
    done = subprocess.run(
        [*buildah(), "inspect", "--type", "image", name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        return None
    info = json.loads(done.stdout)
    labels = info.get("OCIv1", {}).get("config", {}).get("Labels") or {}
    return Stored(id=info["FromImageID"], key=labels.get(KEY_LABEL, ""))


def stored_docker(name: str) -> Stored | None:
    done = subprocess.run(
        ["docker", "image", "inspect", name], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        return None
    (info,) = json.loads(done.stdout)
    labels = info.get("Config", {}).get("Labels") or {}
    return Stored(id=info["Id"], key=labels.get(KEY_LABEL, ""))


def archive_record(image: Image) -> dict[str, int | str]:
    if not (image.record.is_file() and image.archive.is_file()):
        return {}
    return json.loads(image.record.read_text())


# ---- the base -----------------------------------------------------------------------------


def build_base() -> str:
    """The python:3.11-slim stand-in in buildah's storage; returns its id."""
    key = base_key()
    stored = stored_buildah(BASE_IMAGE)
    if stored is not None and stored.key == key:
        print(f"reused {BASE_IMAGE} (key {key[:12]})", flush=True)
        return stored.id
    if shutil.which("debootstrap") is None:
        raise ImageError(
            "make base-image needs debootstrap (apt-get install debootstrap; `make deps` does)"
        )
    started = time.monotonic()
    print(f"building {BASE_IMAGE}: Debian {BASE_SUITE} minbase with debootstrap", flush=True)
    container = run([*buildah(), "from", "scratch"], env=buildah_env()).strip()
    try:
        root = Path(run([*buildah(), "mount", container], env=buildah_env()).strip())
        DEBOOTSTRAP_CACHE.mkdir(parents=True, exist_ok=True)
        mirror = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
        stream(
            ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}"]
            + [f"--cache-dir={DEBOOTSTRAP_CACHE}", BASE_SUITE, str(root), mirror],
            "debootstrap",
        )
        leftover = [line for line in mounts() if line.startswith(str(root) + "/")]
        if leftover:
            raise ImageError(f"debootstrap left mounts in the image: {', '.join(leftover)}")
        for relative in BASE_CLEANUP:
            for entry in (root / relative).glob("*"):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        # Runtimes mount /dev themselves; the device nodes debootstrap made are not shipped.
        for entry in (root / "dev").iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        run([*buildah(), "umount", container], env=buildah_env())
        run(
            [*buildah(), "config", "--env", "LANG=C.UTF-8", "--cmd", '["python3"]']
            + ["--label", f"{KEY_LABEL}={key}", container],
            env=buildah_env(),
        )
        run([*buildah(), "commit", "--rm", container, BASE_IMAGE], timeout_s=600)
    except BaseException:
        subprocess.run([*buildah(), "rm", container], capture_output=True, timeout=120)
        raise
    if stored is not None:
        # The base this one replaces, now untagged (see build_image).
        subprocess.run(
            [*buildah(), "rmi", stored.id], capture_output=True, timeout=120, check=False
        )
    stored = stored_buildah(BASE_IMAGE)
    assert stored is not None
    print(f"built {BASE_IMAGE} in {time.monotonic() - started:.0f} s", flush=True)
    return stored.id


def mounts() -> list[str]:
    with open("/proc/self/mountinfo") as handle:
        return [line.split()[4] for line in handle]


# ---- the images ---------------------------------------------------------------------------


def build_image(image: Image, *, docker: bool, base: str, base_id: str, version: str) -> None:
    name = image.local_name(version)
    key = image_key(image, base, base_id)
    stored = stored_docker(name) if docker else stored_buildah(name)
    if stored is not None and stored.key == key and archive_record(image).get("key") == key:
        print(f"reused {name} (key {key[:12]}), archive {image.archive.relative_to(REPO_ROOT)}")
        return
    started = time.monotonic()
    if stored is None or stored.key != key:
        print(f"building {name} from {image.dockerfile}", flush=True)
        with tempfile.TemporaryDirectory(prefix="tritonscale-build-") as scratch:
            dockerfile = REPO_ROOT / image.dockerfile
            if base:
                # Outside the build context, which stays the repository root.
                dockerfile = Path(scratch) / "Dockerfile"
                dockerfile.write_text(rebased((REPO_ROOT / image.dockerfile).read_text(), base))
            options = ["--file", str(dockerfile), "--tag", name, "--label", f"{KEY_LABEL}={key}"]
            if docker:
                stream(["docker", "build", *options, "."], image.name, env=None)
            else:
                # --pull-never: the base is the local stand-in; nothing is fetched from a registry.
                pull = ["--pull-never"] if base == BASE_IMAGE else []
                trust = build_trust_volumes(Path(scratch))
                command = [*buildah(), "build", *pull, *trust, *options, "."]
                stream(command, image.name, env=buildah_env())
                if stored is not None:
                    # The image this one replaces, now untagged: left, it would fill the
                    # storage with one copy per change. Kept where something still uses it.
                    subprocess.run(
                        [*buildah(), "rmi", stored.id],
                        capture_output=True,
                        timeout=120,
                        check=False,
                    )
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"writing {image.archive.relative_to(REPO_ROOT)}", flush=True)
    # Written beside, then renamed: an interrupted write never passes for a finished archive.
    partial = image.archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    if docker:
        run(["docker", "save", "--output", str(partial), name], timeout_s=900)
    else:
        target = f"oci-archive:{partial}:{name}"
        run([*buildah(), "push", "--quiet", name, target], timeout_s=900, env=buildah_env())
    partial.rename(image.archive)
    layers = archive_layers(image.archive)
    record = {
        "key": key,
        "layers": len(layers),
        "archive_bytes": image.archive.stat().st_size,
        "unpacked_bytes": sum(size for _, size in layers),
    }
    image.record.write_text(json.dumps(record, indent=2) + "\n")
    print(f"built {name} in {time.monotonic() - started:.0f} s", flush=True)


def build_all(python_image: str) -> None:
    os.chdir(REPO_ROOT)  # the build context of every Dockerfile
    version = chart_version()
    docker = docker_engine()
    if docker:
        # Docker pulls the Dockerfiles' pinned base itself unless told another.
        base, base_id = python_image, python_image
    elif python_image:
        stored = stored_buildah(python_image)
        if stored is None:
            run([*buildah(), "pull", python_image], timeout_s=900, env=buildah_env())
            stored = stored_buildah(python_image)
        assert stored is not None
        base, base_id = python_image, stored.id
    else:
        base, base_id = BASE_IMAGE, build_base()
    for image in IMAGES:
        build_image(image, docker=docker, base=base, base_id=base_id, version=version)
    print(summary(version))


def summary(version: str) -> str:
    rows = ["image                                      archive MB  layers  unpacked MB"]
    for image in IMAGES:
        record = archive_record(image)
        packed = int(record["archive_bytes"]) / 1e6
        unpacked = int(record["unpacked_bytes"]) / 1e6
        rows.append(
            f"{image.local_name(version):42} {packed:10.0f}  {record['layers']:6}  {unpacked:11.0f}"
        )
    return "\n".join(rows)


def archive_layers(archive: Path) -> list[tuple[str, int]]:
    """(name, uncompressed bytes) of each layer of an archive's one image: an OCI archive
    (buildah; Docker 25 and later), or a docker-archive (`docker save` of older engines)."""
    layers = []
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        if "index.json" in names:
            index = json.load(member(tar, "index.json"))
            manifest = json.load(member(tar, blob_path(index["manifests"][0]["digest"])))
            paths = [
                (blob_path(layer["digest"]), "gzip" in layer["mediaType"])
                for layer in manifest["layers"]
            ]
        else:
            (manifest,) = json.load(member(tar, "manifest.json"))
            paths = [(path, False) for path in manifest["Layers"]]
        for path, compressed in paths:
            with member(tar, path) as raw:
                layer = gzip.GzipFile(fileobj=raw) if compressed else raw
                size = 0
                while chunk := layer.read(1 << 20):
                    size += len(chunk)
            layers.append((path, size))
    return layers


def blob_path(digest_text: str) -> str:
    return "blobs/sha256/" + digest_text.split(":", 1)[1]


def member(tar: tarfile.TarFile, path: str) -> IO[bytes]:
    found = tar.extractfile(path)
    if found is None:
        raise ImageError(f"{tar.name}: {path} is missing or not a file")
    return found


# ---- push -------------------------------------------------------------------------------


def push_commands(registry: str, version: str, docker: bool) -> list[list[str]]:
    registry = registry.rstrip("/")
    host = registry.split("/", 1)[0]
    # A registry on this machine speaks plain HTTP (a test or a kind-style local registry).
    local = host.split(":", 1)[0] in ("127.0.0.1", "localhost", "[::1]")
    commands = []
    for image in IMAGES:
        target = f"{registry}/{image.name}:{version}"
        if docker:
            commands.append(["docker", "tag", image.local_name(version), target])
            commands.append(["docker", "push", target])
        else:
            tls = ["--tls-verify=false"] if local else []
            commands.append(
                ["buildah", "push", *tls, image.local_name(version), f"docker://{target}"]
            )
    return commands


def push(registry: str, dry_run: bool) -> None:
    version = chart_version()
    docker = docker_engine()
    for command in push_commands(registry, version, docker):
        print(" ".join(command), flush=True)
        if dry_run:
            continue
        if command[0] == "buildah":
            command = [*buildah(), *command[1:]]
        stream(command, f"push {command[-1].rsplit('/', 1)[-1]}", env=buildah_env())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.images", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("base", help=f"build {BASE_IMAGE} with debootstrap (buildah)")
    build = commands.add_parser("build", help="build the three images and their OCI archives")
    build.add_argument(
        "--python-image",
        default=os.environ.get("PYTHON_IMAGE", ""),
        help="base image instead of the stand-in (buildah) or the pinned one (docker)",
    )
    push_parser = commands.add_parser("push", help="push the three images to REGISTRY")
    push_parser.add_argument("registry", help="registry and path, e.g. 127.0.0.1:5000/tritonscale")
    push_parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    try:
        if args.command == "base":
            os.chdir(REPO_ROOT)
            build_base()
        elif args.command == "build":
            build_all(args.python_image)
        else:
            push(args.registry, args.dry_run)
    except ImageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
