"""The repository speaks of the product alone: no path of a developer's machine in any file,
and no document cited that the repository does not hold."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.tooling import require_tool

REPO_ROOT = Path(__file__).resolve().parents[1]
THIS_FILE = Path(__file__).resolve().relative_to(REPO_ROOT).as_posix()

# An absolute path under a folder of someone's machine: /work, /tmp, /root or /home, alone or
# with more below it. Not inside a word or a URL ("github.com/home" is not a path).
MACHINE_PATH = re.compile(
    r"(?<![\w.~/-])/(?:work|tmp|root|home)(?![\w-])(?:/[^\s'\"`()\[\]{},;]*)?"
)
# Paths that may stay, and why.
ALLOWED = {
    "/tmp": "a container's own temporary folder: the operator's writable emptyDir under a "
    "read-only root filesystem, its image's WORKDIR, where Triton's Python backend writes",
    "/home/locust": "the Locust containers' home: an emptyDir under their read-only root",
    "/home/locust/.cache": "XDG_CACHE_HOME inside that emptyDir",
}
# A document named in a file, such as `docs/rbac.md`; a URL is skipped whole (a page of
# another project's documentation is cited, not kept here).
DOCUMENT = re.compile(r"[a-z][a-z0-9+.-]*://\S+|[\w./-]*[\w-]+\.md\b")


def documents(text: str) -> set[str]:
    """The repository documents `text` names (URLs left out)."""
    return {found for found in DOCUMENT.findall(text) if "://" not in found}


def machine_paths(text: str) -> list[str]:
    """The machine paths in a text that are not allowed."""
    paths = (path.rstrip(".:") for path in MACHINE_PATH.findall(text))
    return [path for path in paths if path not in ALLOWED]


def tracked_text_files() -> dict[str, str]:
    """Every file git tracks (links excluded: their targets are tracked), by path, as text."""
    git = require_tool("git")
    listing = subprocess.run(
        [git, "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    files = {}
    for name in filter(None, listing.split("\0")):
        path = REPO_ROOT / name
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" not in data:  # text only
            files[name] = data.decode(errors="replace")
    return files


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    found = tracked_text_files()
    assert "pyproject.toml" in found and len(found) > 100
    return found


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "found"),
    [
        (
            "logs in /work/wt-x/reports and /tmp/run-1/out.txt",
            ["/work/wt-x/reports", "/tmp/run-1/out.txt"],
        ),
        ("cd /root && ls /home/alice", ["/root", "/home/alice"]),
        ("mountPath: /tmp", []),
        ("see https://example.com/home/page or ./tmp/x or /var/tmp/x", []),
        ("the emptyDir at /dev/shm", []),
        ("/workspace and /tmp. and /tmp/", ["/tmp/"]),
    ],
)
def test_the_check_finds_machine_paths_and_lets_the_allowed_ones_be(
    text: str, found: list[str]
) -> None:
    assert machine_paths(text) == found


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("see docs/rbac.md and README.md.", {"docs/rbac.md", "README.md"}),
        ("https://github.com/grpc/grpc/blob/master/doc/wait-for-ready.md", set()),
        ("(gRPC's <https://grpc.io/docs/guides/retry.md>) then docs/rbac.md", {"docs/rbac.md"}),
    ],
)
def test_the_check_names_repository_documents_not_urls(text: str, found: set[str]) -> None:
    assert documents(text) == found


def test_no_file_holds_a_path_of_a_developers_machine(files: dict[str, str]) -> None:
    found = [
        f"{name}:{number}: {path}"
        for name, text in files.items()
        if name != THIS_FILE  # its examples are what it looks for
        for number, line in enumerate(text.splitlines(), 1)
        for path in machine_paths(line)
    ]
    assert found == [], "machine paths in the repository:\n" + "\n".join(found)


def test_every_document_a_file_names_is_in_the_repository(files: dict[str, str]) -> None:
    """A reference to notes kept elsewhere helps no reader: say it here or drop it."""
    names = {Path(name).name for name in files}
    missing = sorted(
        f"{name}: {document}"
        for name, text in files.items()
        for document in documents(text)
        if Path(document).name not in names
    )
    assert missing == [], "documents named but not in the repository:\n" + "\n".join(missing)
