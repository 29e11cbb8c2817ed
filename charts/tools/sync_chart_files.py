"""Copy the files the chart ships from the rest of the repository into charts/tritonscale/files.

Helm reads only files inside the chart folder, so the chart keeps copies of:

- models/                                -> files/models/     (model repository ConfigMaps)
- dashboards/*.json                      -> files/dashboards/ (Grafana dashboard ConfigMaps)
- dashboards/rules/tritonscale.rules.yaml -> files/rules/      (the PrometheusRule)
- loadtests/bls.py                       -> files/loadtests/  (the Locust ConfigMap)

    python charts/tools/sync_chart_files.py          # copy, and delete stale copies
    python charts/tools/sync_chart_files.py --check  # exit 1 and list the drift

A source that does not exist yet gives an empty copy, not an error: the chart renders
without it (tests/chart checks that).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_FILES = REPO_ROOT / "charts" / "tritonscale" / "files"
# The synced folders of files/; everything else there (files/scripts) is the chart's own.
SYNCED = ("models", "dashboards", "rules", "loadtests")
# The locustfiles the Locust pods run. Other scripts of loadtests/ (the soak, the benchmarks)
# start their own tritonserver and have no place in the Locust ConfigMap.
LOCUSTFILES = ("bls.py",)


def _wanted(path: Path, root: Path) -> bool:
    """Skip caches and hidden files: they are build output, not content."""
    parts = path.relative_to(root).parts
    return (
        path.is_file()
        and not any(part.startswith(".") or part == "__pycache__" for part in parts)
        and path.suffix != ".pyc"
    )


def expected_files(repo_root: Path = REPO_ROOT) -> dict[str, Path]:
    """Map each synced file's path under files/ to its source."""
    files: dict[str, Path] = {}
    models = repo_root / "models"
    if models.is_dir():
        for path in sorted(models.rglob("*")):
            # Only files inside a model's folder: a top-level README is no part of a model.
            if _wanted(path, models) and len(path.relative_to(models).parts) > 1:
                files[f"models/{path.relative_to(models).as_posix()}"] = path
    for path in sorted((repo_root / "dashboards").glob("*.json")):
        files[f"dashboards/{path.name}"] = path
    rules = repo_root / "dashboards" / "rules" / "tritonscale.rules.yaml"
    if rules.is_file():
        files["rules/tritonscale.rules.yaml"] = rules
    for name in LOCUSTFILES:
        path = repo_root / "loadtests" / name
        if path.is_file():
            files[f"loadtests/{name}"] = path
    return files


def _present_files(chart_files: Path) -> set[str]:
    present = set()
    for folder in SYNCED:
        base = chart_files / folder
        if base.is_dir():
            present |= {
                p.relative_to(chart_files).as_posix() for p in base.rglob("*") if p.is_file()
            }
    return present


def drift(repo_root: Path = REPO_ROOT, chart_files: Path = CHART_FILES) -> list[str]:
    """One line per difference between the sources and the chart's copies; empty when in sync."""
    expected = expected_files(repo_root)
    present = _present_files(chart_files)
    lines = []
    for rel, source in expected.items():
        copy = chart_files / rel
        if rel not in present:
            lines.append(f"missing in chart: files/{rel} (from {source.relative_to(repo_root)})")
        elif copy.read_bytes() != source.read_bytes():
            lines.append(f"differs: files/{rel} (from {source.relative_to(repo_root)})")
    lines += [f"stale in chart: files/{rel}" for rel in sorted(present - expected.keys())]
    return lines


def sync(repo_root: Path = REPO_ROOT, chart_files: Path = CHART_FILES) -> list[str]:
    """Make the copies equal to the sources; return what changed."""
    changes = drift(repo_root, chart_files)
    expected = expected_files(repo_root)
    for rel, source in expected.items():
        copy = chart_files / rel
        data = source.read_bytes()
        if not copy.is_file() or copy.read_bytes() != data:
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(data)
    for rel in _present_files(chart_files) - expected.keys():
        (chart_files / rel).unlink()
    # Drop folders that the deletions emptied, deepest first.
    for folder in SYNCED:
        base = chart_files / folder
        if base.is_dir():
            for path in sorted(base.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if path.is_dir() and not any(path.iterdir()):
                    path.rmdir()
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift, change nothing")
    args = parser.parse_args(argv)
    if args.check:
        lines = drift()
        for line in lines:
            print(line)
        if lines:
            print("chart files are out of sync: run `make chart-sync`", file=sys.stderr)
            return 1
        return 0
    for line in sync():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
