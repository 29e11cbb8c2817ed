"""hack/vegeta/build.py: hack.gotools.go_install builds the pinned release, and a built binary is
found, not rebuilt."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from hack import gotools
from hack.vegeta import build

pytestmark = pytest.mark.unit


def test_one_folder_per_release_under_the_tools_folder(tmp_path: Path) -> None:
    assert re.fullmatch(r"v12\.\d+\.\d+", build.VERSION)
    assert build.binary(tmp_path) == tmp_path.resolve() / f"vegeta-{build.VERSION}" / "vegeta"


def test_go_install_builds_the_pinned_release_stamped_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []

    def go_install(package: str, target: Path, progress: Any, *, ldflags: str) -> Path:
        calls.append((package, target, ldflags))
        return target

    monkeypatch.setattr(gotools, "go_install", go_install)
    path = build.build(tmp_path, progress=lambda line: None)
    # `go install PACKAGE@VERSION` reads vegeta's own go.mod and go.sum: no module of ours.
    assert calls == [
        (
            f"{build.PACKAGE}@{build.VERSION}",
            build.binary(tmp_path),
            f"-s -w -X main.Version={build.VERSION}",
        )
    ]
    assert path == build.binary(tmp_path)
    assert not list(Path(build.__file__).parent.glob("go.*"))


def test_a_second_run_finds_the_binary_and_builds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = build.binary(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("")
    # Were it to build, it would look for go first: without one it would fail.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    lines: list[str] = []
    assert build.build(tmp_path, progress=lines.append) == path
    assert lines == []


def test_without_go_the_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(build.VegetaBuildError, match=r"^go not found on PATH[^\n]*$"):
        build.build(tmp_path)
