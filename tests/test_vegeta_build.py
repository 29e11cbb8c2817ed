"""hack/vegeta/build.py: the release comes from go.mod, and a built binary is found, not rebuilt."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack.vegeta import build

pytestmark = pytest.mark.unit


def test_the_release_is_the_one_go_mod_requires() -> None:
    go_mod = (build.MODULE_DIR / "go.mod").read_text()
    assert build.version().startswith("v12.")
    assert f"{build.PACKAGE} {build.version()}" in go_mod
    # tools.go keeps the requirement through `go mod tidy`; go.sum pins what it downloads.
    assert build.PACKAGE in (build.MODULE_DIR / "tools.go").read_text()
    assert f"{build.PACKAGE} {build.version()} h1:" in (build.MODULE_DIR / "go.sum").read_text()


def test_one_folder_per_release_under_the_tools_folder(tmp_path: Path) -> None:
    assert build.binary(tmp_path) == tmp_path.resolve() / f"vegeta-{build.version()}" / "vegeta"


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
    with pytest.raises(build.VegetaBuildError, match="go not found on PATH"):
        build.build(tmp_path)
