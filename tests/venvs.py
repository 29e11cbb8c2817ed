"""Real installs for the packaging tests: the wheel, and fresh virtual environments.

An environment is built the way the images build theirs (operator/Dockerfile,
loadtests/Dockerfile): `python -m venv --without-pip`, then pip from outside installs into
it (the operator's: its lock with --require-hashes, then the wheel with --no-deps), so that
the environment holds the packages and nothing of pip's own. Its size is the size of the
image's Python environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# pip installs from PyPI through the local cache; a cold cache on a slow link takes longer.
INSTALL_TIMEOUT_S = 600


def clean_environment(**extra: str) -> dict[str, str]:
    """The caller's environment without anything that would put the checkout on a path, and
    without an outer make's state (`make test` runs the suite: a `make` a test starts must
    behave as a user's top-level one, not as a sub-make)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
        and key not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")
    }
    # The checkout's own environment must not be found first on PATH either.
    own_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != own_bin)
    env.update(extra)
    return env


def pip(*args: str, cwd: Path) -> None:
    """pip of the test's own environment, from `cwd`; a failure shows pip's last lines."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
        cwd=cwd,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise AssertionError(f"pip {' '.join(args)} failed:\n{tail}")


def build_wheel(into: Path) -> Path:
    """`pip wheel --no-deps` of the checkout: the same wheel operator/Dockerfile builds."""
    pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(into), str(REPO_ROOT), cwd=into)
    (wheel,) = into.glob("tritonscale-*.whl")
    return wheel


@dataclass(frozen=True)
class Environment:
    """A virtual environment at `path` with no pip of its own."""

    path: Path

    @classmethod
    def create(cls, path: Path, *requirements: str, compile_bytecode: bool = True) -> Environment:
        """A fresh environment with `requirements` installed, pip running from `path.parent`.

        Byte-compiling (as the images do: their root filesystem is read-only at run time)
        doubles the install time; a test that does not measure size may skip it.
        """
        venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
        environment = cls(path)
        environment.install(*requirements, compile_bytecode=compile_bytecode)
        return environment

    def install(self, *requirements: str, compile_bytecode: bool = True) -> None:
        """pip install `requirements` (and any pip options among them) into this environment."""
        options = ["--quiet"] if compile_bytecode else ["--quiet", "--no-compile"]
        pip("--python", str(self.python), "install", *options, *requirements, cwd=self.path.parent)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)

    def packages(self) -> dict[str, str]:
        """Installed distributions, name -> version, as the environment's own Python sees them."""
        listing = subprocess.run(
            [
                str(self.python),
                "-c",
                "import json, importlib.metadata as m; "
                "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))",
            ],
            env=clean_environment(),
            cwd=self.path,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return dict(sorted(json.loads(listing.stdout).items(), key=lambda kv: kv[0].lower()))

    def size_bytes(self) -> int:
        """Bytes of every file in the environment (links counted once, as a layer stores them)."""
        return sum(
            path.lstat().st_size
            for path in self.path.rglob("*")
            if path.is_file() and not path.is_symlink()
        )


def megabytes(size_bytes: int) -> float:
    return round(size_bytes / 1e6, 1)
