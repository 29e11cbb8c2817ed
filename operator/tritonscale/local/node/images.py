"""Which local program stands in for which container image.

No container runtime runs here, so an image is a role: the stand-in recognises the images
the chart uses by repository (registry and tag do not matter, so mirrors work) and runs
the container's command with a PATH that holds this machine's programs for that role:

| image repository (suffix) | role | programs on PATH |
|---|---|---|
| `nvidia/tritonserver` | triton | `tritonserver` (the nvidia-pytriton wheel's server, with its Python backend), the environment's `python3` |
| `tritonscale/tritonscale-operator` | operator | the environment's `tritonscale`, `locust`, `python3` |
| `tritonscale/tritonscale-locust`, `locustio/locust` | locust | the environment's `locust`, `python3` |
| `python` | python | the environment's `python3` |

"The environment" is the Python environment the stand-in itself runs in (the project's
.venv). An image not in the table fails its pod with reason ErrImagePull and a message that
names the image.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tritonscale.local.triton_server import TritonInstall

SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

# Repository suffix -> role; the longest matching suffix wins.
IMAGE_ROLES = {
    "nvidia/tritonserver": "triton",
    "tritonscale/tritonscale-operator": "operator",
    "tritonscale/tritonscale-locust": "locust",
    "locustio/locust": "locust",
    "python": "python",
}


@dataclass(frozen=True)
class LocalImage:
    """What an image gives a container: programs on PATH, a default command, a workdir."""

    role: str
    path: tuple[str, ...]
    entrypoint: tuple[str, ...] = ()
    working_dir: str = "/"
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def path_variable(self) -> str:
        return os.pathsep.join([*self.path, *SYSTEM_PATH])


def repository(image: str) -> str:
    """`nvcr.io/nvidia/tritonserver:24.10-py3` -> `nvidia/tritonserver`."""
    name = image.split("@", 1)[0]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        name = rest  # a registry host
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > last_slash:
        name = name[:colon]
    return name


def role_of(image: str) -> str | None:
    repo = repository(image)
    matches = [key for key in IMAGE_ROLES if repo == key or repo.endswith("/" + key)]
    return IMAGE_ROLES[max(matches, key=len)] if matches else None


def write_triton_wrapper(into: Path) -> Path:
    """A `tritonserver` for the triton image's PATH: the wheel's binary, its libraries and a
    backend folder with the stub for this Python (the NGC image has them in /opt/tritonserver).
    Returns the folder to put on PATH."""
    install = TritonInstall()
    backends = install.make_backend_directory(into / "backends")
    bin_dir = into / "bin"
    bin_dir.mkdir(parents=True)
    wrapper = bin_dir / "tritonserver"
    # A shell line, so that `sh -c "... && exec tritonserver"` in a pod finds it on PATH too.
    wrapper.write_text(
        "#!/bin/sh\n"
        f'LD_LIBRARY_PATH="{install.libraries}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n'
        "export LD_LIBRARY_PATH\n"
        f'exec "{install.binary}" --backend-directory="{backends}" "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


def image_table(python_bin: Path, triton_bin: Path | None) -> dict[str, LocalImage]:
    """Role -> LocalImage, with `python_bin` the environment's bin folder."""
    env_bin = str(python_bin)
    python_env = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    table = {
        # As operator/Dockerfile: ENTRYPOINT tritonscale operator, WORKDIR /tmp.
        "operator": LocalImage(
            "operator", (env_bin,), ("tritonscale", "operator"), "/tmp", python_env
        ),
        "locust": LocalImage("locust", (env_bin,), ("locust",), "/", python_env),
        "python": LocalImage("python", (env_bin,), ("python3",), "/", python_env),
    }
    if triton_bin is not None:
        # The environment's python3 after tritonserver: the Python backend's stub takes its
        # interpreter prefix from the first python3 on PATH, and models import its numpy.
        table["triton"] = LocalImage("triton", (str(triton_bin), env_bin))
    return table
