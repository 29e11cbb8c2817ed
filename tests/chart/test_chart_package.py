"""The chart's files/ links to the one real copy, and `helm package` puts the contents in the archive.

files/models links to models/, files/dashboards/*.json to dashboards/, files/rules to
dashboards/rules/ and files/loadtests/bls.py to loadtests/. Helm follows the links; these
tests open what Helm 3 and Helm 4 package and render it, so that a link Helm would not
follow, or a file left out of the archive, fails here and not on a user's cluster.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import CHART, REPO_ROOT, by_kind, run_helm, template_args

# The chart's linked entries: the link under charts/tritonscale/files -> what it points at.
LINKS = {
    "models": REPO_ROOT / "models",
    **{
        f"dashboards/{path.name}": path
        for path in sorted((REPO_ROOT / "dashboards").glob("*.json"))
    },
    "rules/tritonscale.rules.yaml": REPO_ROOT / "dashboards" / "rules" / "tritonscale.rules.yaml",
    "loadtests/bls.py": REPO_ROOT / "loadtests" / "bls.py",
}
# The folders of files/ that hold the links; files/scripts is the chart's own.
LINKED_FOLDERS = ("models", "dashboards", "rules", "loadtests")
MODELS = sorted(path.parent.name for path in (REPO_ROOT / "models").glob("*/config.pbtxt"))


def _is_content(path: Path, root: Path) -> bool:
    """A file the chart ships: no byte-code cache, no hidden file (.helmignore drops those)."""
    parts = path.relative_to(root).parts
    return (
        path.is_file()
        and "__pycache__" not in parts
        and not any(part.startswith(".") for part in parts)
        and path.suffix != ".pyc"
    )


def expected_files() -> dict[str, Path]:
    """Each file the package must carry under files/ -> the source file it comes from."""
    models = REPO_ROOT / "models"
    files = {
        f"models/{path.relative_to(models).as_posix()}": path
        for path in sorted(models.rglob("*"))
        # Only the models' own folders: the repository's README is no part of a model.
        if _is_content(path, models) and len(path.relative_to(models).parts) > 1
    }
    files.update({rel: source for rel, source in LINKS.items() if rel != "models"})
    return files


def packaged_files(archive: Path) -> dict[str, tarfile.TarInfo]:
    """The archive's members under tritonscale/files/<linked folder>/, by path below files/."""
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    prefix = "tritonscale/files/"
    return {
        member.name.removeprefix(prefix): member
        for member in members
        if member.name.startswith(prefix)
        and member.name.removeprefix(prefix).split("/")[0] in LINKED_FOLDERS
    }


@pytest.mark.unit
@pytest.mark.parametrize("rel", sorted(LINKS))
def test_each_linked_entry_is_a_relative_link_to_the_one_real_copy(rel: str) -> None:
    link = CHART / "files" / rel
    assert link.is_symlink(), f"charts/tritonscale/files/{rel} must be a link, not a copy"
    target = os.readlink(link)
    assert not os.path.isabs(target), f"{rel} -> {target}: a link must be relative"
    assert link.resolve() == LINKS[rel].resolve()


@pytest.mark.unit
def test_the_linked_folders_hold_nothing_but_the_links() -> None:
    """A dashboard added to dashboards/ needs its link; a stray copy is not allowed."""
    entries = {
        path.relative_to(CHART / "files").as_posix()
        for folder in ("dashboards", "rules", "loadtests")
        for path in (CHART / "files" / folder).iterdir()
    }
    assert entries == set(LINKS) - {"models"}


def test_the_package_carries_the_real_files_contents(packaged_chart: Path) -> None:
    expected = expected_files()
    members = packaged_files(packaged_chart)
    assert sorted(members) == sorted(expected)
    assert len([rel for rel in expected if rel.startswith("models/")]) >= 2 * len(MODELS)
    with tarfile.open(packaged_chart) as tar:
        for rel, source in expected.items():
            member = members[rel]
            assert member.isfile(), f"{rel} is packaged as a {member.type!r}, not a file"
            data = tar.extractfile(member).read()
            assert data == source.read_bytes(), f"{rel} differs from {source}"


def test_the_packaged_chart_renders_every_models_files(helm: str, packaged_chart: Path) -> None:
    result = run_helm(helm, *template_args(chart=packaged_chart))
    assert result.returncode == 0, result.stderr
    configmaps = {
        cm["metadata"]["labels"]["tritonscale.io/model"]: cm
        for cm in by_kind(result.objects, "ConfigMap")
        if "tritonscale.io/model" in cm["metadata"].get("labels", {})
    }
    assert sorted(configmaps) == MODELS
    for model in MODELS:
        folder = REPO_ROOT / "models" / model
        sources = {
            path.relative_to(folder).as_posix(): path.read_text()
            for path in sorted(folder.rglob("*"))
            if _is_content(path, folder)
        }
        # The default values are GPU mode: every instance group becomes KIND_GPU.
        sources["config.pbtxt"] = sources["config.pbtxt"].replace("KIND_CPU", "KIND_GPU")
        data = configmaps[model]["data"]
        assert {key.replace("__", "/"): text for key, text in data.items()} == sources, model


def test_the_packaged_chart_renders_the_dashboards_rules_and_locustfile(
    helm: str, packaged_chart: Path
) -> None:
    result = run_helm(
        helm,
        *template_args(
            "monitoring-values.yaml", sets=("locust.enabled=true",), chart=packaged_chart
        ),
    )
    assert result.returncode == 0, result.stderr
    data = {
        name: text
        for cm in by_kind(result.objects, "ConfigMap")
        for name, text in cm["data"].items()
    }
    for rel, source in LINKS.items():
        if rel.startswith("dashboards/"):  # the template trims the final newline
            assert json.loads(data[source.name]) == json.loads(source.read_text()), rel
        elif rel.startswith("loadtests/"):
            assert data[source.name] == source.read_text(), rel
    (rule,) = by_kind(result.objects, "PrometheusRule")
    rules_source = LINKS["rules/tritonscale.rules.yaml"]
    assert rule["spec"]["groups"] == yaml.safe_load(rules_source.read_text())["groups"]
