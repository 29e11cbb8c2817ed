"""The operator image's lock (operator/requirements.txt, `make lock`) is pyproject.toml's base
install, resolved for the image's Python, every distribution pinned with hashes; and the
Dockerfile installs it that way.

These compare files only: nothing here resolves against PyPI, so an upstream release can
neither fail nor pass them. What they catch is a pyproject.toml changed without `make lock`,
an image's Python changed without it, and a lock edited into something pip would not install
with --require-hashes.
"""

from __future__ import annotations

import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hack import lock
from tests.test_images import instructions

pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")

pytestmark = pytest.mark.unit


def texts() -> tuple[str, str, str, str]:
    return (
        lock.PYPROJECT.read_text(),
        lock.SOURCE.read_text(),
        lock.LOCK.read_text(),
        lock.DOCKERFILE.read_text(),
    )


def test_the_lock_is_pyproject_s_base_install_resolved_for_the_image() -> None:
    found = lock.problems(*texts())
    if found:
        pytest.fail("\n".join(found), pytrace=False)


def test_every_base_requirement_is_pinned_in_the_lock_with_hashes() -> None:
    pyproject, _, lock_text, _ = texts()
    pins = lock.pins(lock_text)
    for text in lock.base_dependencies(pyproject):
        requirement, hashes = pins[canonicalize_name(Requirement(text).name)]
        assert str(requirement).count("==") == 1, requirement
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), text
    # Resolved with the options the Dockerfile needs, from the .in (Dependabot reruns them).
    header = next(
        line for line in lock_text.splitlines() if line.lstrip("# ").startswith("pip-compile ")
    )
    assert "--generate-hashes" in header and header.endswith(" requirements.in"), header


def test_a_dependency_added_to_pyproject_names_make_lock() -> None:
    pyproject, source, lock_text, dockerfile = texts()
    changed = pyproject.replace('"click>=8.1",', '"click>=8.1",\n    "rich>=13",', 1)
    assert changed != pyproject
    assert lock.problems(changed, source, lock_text, dockerfile) == [
        "operator/requirements.in is not pyproject.toml's [project] dependencies: run `make lock`"
    ]


def test_a_bound_raised_past_the_pin_or_another_python_names_make_lock() -> None:
    pyproject, _, lock_text, dockerfile = texts()
    version = lock.pins(lock_text)["kopf"][0].specifier
    raised = pyproject.replace('"kopf>=1.37"', '"kopf>=999"', 1)
    found = lock.problems(
        raised, lock.source_text(lock.base_dependencies(raised)), lock_text, dockerfile
    )
    assert found == [
        f"operator/requirements.txt: kopf{version} is outside kopf>=999: run `make lock`"
    ]
    other_python = dockerfile.replace("python:3.11-slim@", "python:3.12-slim@")
    source = lock.SOURCE.read_text()
    (problem,) = lock.problems(pyproject, source, lock_text, other_python)
    assert problem.endswith("the image runs 3.12: run `make lock`"), problem


def test_a_pin_without_hashes_is_named() -> None:
    pyproject, source, lock_text, dockerfile = texts()
    unhashed = re.sub(r"(?m)^(pyyaml==\S+) \\\n(\s+--hash=\S+( \\\n)?)+", r"\1\n", lock_text)
    assert unhashed != lock_text
    (problem,) = lock.problems(pyproject, source, unhashed, dockerfile)
    assert re.fullmatch(r"operator/requirements.txt: pyyaml==\S+ has no hashes", problem), problem


def test_the_operator_image_installs_the_lock_with_hashes_then_the_wheel_alone() -> None:
    steps = instructions(lock.DOCKERFILE)
    runs = [args for name, args in steps if name == "RUN"]
    (install_lock,) = [r for r in runs if "--require-hashes" in r]
    assert "--requirement requirements.txt" in install_lock
    (install_wheel,) = [r for r in runs if "tritonscale-*.whl" in r and " install " in r]
    assert "install --no-deps /wheels/tritonscale-*.whl" in install_wheel
    assert runs.index(install_lock) < runs.index(install_wheel)
    assert ("COPY", "operator/requirements.txt ./") in steps
