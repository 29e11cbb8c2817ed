"""Running the real helm binaries on the chart, and reading what they render."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "tritonscale"
TOOLS_DIR = REPO_ROOT / "charts" / "tools"
CI_VALUES = sorted(path.name for path in (CHART / "ci").glob("*-values.yaml"))
RELEASE, NAMESPACE = "demo", "inference"


def load_tool(name: str) -> Any:
    """Import one of charts/tools/*.py (a script folder, not a package)."""
    spec = importlib.util.spec_from_file_location(f"chart_tools_{name}", TOOLS_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def objects(self) -> list[dict]:
        return [doc for doc in yaml.safe_load_all(self.stdout) if doc]


@functools.cache
def run_helm(binary: str, *args: str) -> Result:
    """One helm command; cached, since many tests read the same render."""
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)
    return Result(done.returncode, done.stdout, done.stderr)


def template_args(
    *values_files: str,
    sets: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
    chart: Path = CHART,
) -> tuple[str, ...]:
    """`helm template` of the chart folder (or of a packaged .tgz) with ci/ values files."""
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE, *extra]
    for name in values_files:
        args += ["-f", str(CHART / "ci" / name)]
    for item in sets:
        args += ["--set", item]
    return tuple(args)


def package_chart(helm: str, destination: Path) -> Path:
    """`helm package` the chart into destination: the .tgz a user installs from a repository.

    Helm follows the links in files/, so the archive holds the linked files' contents.
    """
    destination.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [helm, "package", str(CHART), "--destination", str(destination)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (archive,) = destination.glob("tritonscale-*.tgz")
    return archive


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict], kind: str, name_suffix: str = "") -> dict:
    """The single object of a kind (whose name ends with name_suffix)."""
    found = [obj for obj in by_kind(objects, kind) if obj["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, (
        f"expected one {kind} *{name_suffix}, found {[o['metadata']['name'] for o in found]}"
    )
    return found[0]


def container(deployment: dict, name: str) -> dict:
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    return containers[name]
