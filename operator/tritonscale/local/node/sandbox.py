"""A pod's sandbox: its network namespace, and a mount namespace holding its root.

What a container runtime's pause container holds, the stand-in holds with one sleeping
process (`pause`): it lives in the pod's network namespace and in a mount namespace of its
own, where a tmpfs is the pod's root folder. That root mirrors the machine (every top-level
entry of / bind-mounted, recursively), so the programs of `images` run unchanged; Memory
emptyDirs are tmpfs mounts of this namespace, so they outlive a container's restart, as a
pod's /dev/shm does.

Each container starts in a fresh mount namespace copied from the pause's and mounts its
own volumeMounts into the root, then chroots into it: `/models`, `/dev/shm`,
`/opt/tritonscale/scripts` and `/var/run/secrets/kubernetes.io/serviceaccount` are where the
pod spec says. A mount point whose parent folder the machine lacks is made in the tmpfs
root (a new top-level folder) or in an overlay of the deepest existing folder, so no
file of the machine is ever written. The node's own state folder is hidden from pods.

The mounts vanish with their namespaces when the last process in them ends; nothing is
left on the machine.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import tritonscale
from tritonscale.local.node.errors import NodeError

READY_TIMEOUT_S = 20.0
ROOT_SIZE = "64m"  # the tmpfs root only holds mount points and new top-level folders
# What the stand-in's programs run from: the Python environment (its `tritonscale`, `locust`,
# the server wheel) and the package's own source (an editable install). A volume a pod mounts
# over one of them (the operator's /tmp emptyDir over a checkout in /tmp) must not hide it:
# each is bound again on top of the pod's volumes.
PROGRAM_PATHS = tuple(
    sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)})
    # The folder that holds the `tritonscale` package: the checkout's operator/ when it is
    # installed editable, site-packages (inside sys.prefix) otherwise.
    + [os.path.dirname(os.path.realpath(tritonscale.__path__[0]))]
)


@dataclass(frozen=True)
class Mount:
    """One volumeMount: `source` on the machine (as the pause sees it) at `target` in the pod."""

    source: Path
    target: str
    read_only: bool = False


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise NodeError(f"{name} not found on PATH")
    return path


def _resolved(target: str) -> str:
    """A mount target with the machine's symlinks followed (the root mirrors them)."""
    return os.path.realpath(os.path.normpath(target))


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _deepest_existing(path: str) -> str:
    """The deepest folder of the machine on `path`'s way down (at least "/")."""
    current = path
    while current != "/" and not os.path.lexists(current):
        current = os.path.dirname(current)
    return current


class Sandbox:
    """The pause process of one pod; `container_command` and `exec_command` enter it."""

    def __init__(
        self,
        pod_dir: Path,
        netns: str,
        hidden: Path,
        memory_volumes: dict[Path, int | None],
    ) -> None:
        self.pod_dir = pod_dir
        self.root = pod_dir / "root"
        self.netns = netns
        self.hidden = hidden  # the node's state folder: pods never see it
        self.memory_volumes = memory_volumes  # folder -> tmpfs size in bytes (None: no limit)
        self.process: subprocess.Popen[bytes] | None = None
        self.tools = {name: _tool(name) for name in ("nsenter", "unshare", "mount", "chroot")}

    @property
    def pid(self) -> int:
        assert self.process is not None, "the sandbox has not been started"
        return self.process.pid

    def _pause_script(self) -> str:
        mount, root = self.tools["mount"], shlex.quote(str(self.root))
        lines = ["set -eu", f"{mount} -t tmpfs -o mode=0755,size={ROOT_SIZE} tsn-root {root}"]
        for entry in sorted(os.listdir("/")):
            source, target = f"/{entry}", shlex.quote(f"{self.root}/{entry}")
            if os.path.islink(source):
                lines.append(f"ln -s {shlex.quote(os.readlink(source))} {target}")
            elif os.path.isdir(source):
                lines.append(f"mkdir {target} && {mount} --rbind {shlex.quote(source)} {target}")
            else:
                lines.append(f": > {target} && {mount} --bind {shlex.quote(source)} {target}")
        for folder, size in self.memory_volumes.items():
            options = "mode=1777" + (f",size={size}" if size else "")
            lines.append(f"{mount} -t tmpfs -o {options} tsn-memory {shlex.quote(str(folder))}")
        lines.append(f": > {shlex.quote(str(self.pod_dir / 'sandbox-ready'))}")
        lines.append("exec sleep infinity")
        return "\n".join(lines)

    def start(self, preexec_fn: Callable[[], None] | None = None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for folder in self.memory_volumes:
            folder.mkdir(parents=True, exist_ok=True)
        log = open(self.pod_dir / "sandbox.log", "wb")  # noqa: SIM115 - the child holds it
        with log:
            self.process = subprocess.Popen(
                [
                    self.tools["nsenter"],
                    f"--net=/run/netns/{self.netns}",
                    "--",
                    self.tools["unshare"],
                    "--mount",
                    "--propagation",
                    "private",
                    "--",
                    "/bin/sh",
                    "-c",
                    self._pause_script(),
                ],  # fmt: skip
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec_fn,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not (self.pod_dir / "sandbox-ready").exists():
            if self.process.poll() is not None:
                reason = (self.pod_dir / "sandbox.log").read_text(errors="replace").strip()
                raise NodeError(f"pod sandbox failed: {reason.splitlines()[-1] if reason else '?'}")
            if time.monotonic() > deadline:
                self.stop()
                raise NodeError(f"pod sandbox not ready after {READY_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def _mount_lines(self, mounts: Sequence[Mount], scratch: Path, hosts_file: Path) -> list[str]:
        mount, root = self.tools["mount"], str(self.root)
        lines: list[str] = []
        # Parents before children, as a runtime mounts them.
        ordered = sorted(mounts, key=lambda m: _resolved(m.target).count("/"))
        targets = [_resolved(m.target) for m in ordered]
        overlays: list[str] = []
        for target in targets:
            existing = _deepest_existing(target)
            if existing in ("/", target) or any(_within(existing, t) for t in targets):
                continue  # on the tmpfs root, the machine's own folder, or in a volume
            if not any(_within(existing, lower) for lower in overlays):
                overlays.append(existing)
        for number, lower in enumerate(overlays):
            upper, work = (
                scratch / f"overlay-{number}" / "upper",
                scratch / f"overlay-{number}" / "work",
            )
            upper.mkdir(parents=True, exist_ok=True)
            work.mkdir(parents=True, exist_ok=True)
            lines.append(
                f"{mount} -t overlay tsn-overlay -o "
                + shlex.quote(f"lowerdir={lower},upperdir={upper},workdir={work}")
                + f" {shlex.quote(root + lower)}"
            )
        # After the overlays, which would show it again.
        if os.path.isdir(self.hidden):
            lines.append(
                f"{mount} -t tmpfs -o size=4k,mode=0755 tsn-hidden "
                f"{shlex.quote(root + str(self.hidden))}"
            )
        for item in ordered:
            target = shlex.quote(root + _resolved(item.target))
            source = shlex.quote(str(item.source))
            if item.source.is_dir():
                lines.append(f"mkdir -p {target}")
            else:
                lines.append(
                    f"mkdir -p $(dirname {target}) && {{ [ -e {target} ] || : > {target}; }}"
                )
            lines.append(f"{mount} --bind {source} {target}")
            if item.read_only:
                lines.append(f"{mount} -o remount,bind,ro {target}")
        for program in PROGRAM_PATHS:
            if any(_within(program, target) for target in targets):
                where = shlex.quote(root + program)
                lines.append(f"mkdir -p {where} && {mount} --rbind {shlex.quote(program)} {where}")
        lines.append(
            f"{mount} --bind {shlex.quote(str(hosts_file))} {shlex.quote(root + '/etc/hosts')}"
        )
        return lines

    def container_command(
        self,
        argv: Sequence[str],
        working_dir: str,
        mounts: Sequence[Mount],
        scratch: Path,
        hosts_file: Path,
    ) -> list[str]:
        """The command that runs `argv` as a container of this pod: in the pod's network
        namespace, in a mount namespace of its own with its volumes, chrooted to the root."""
        script = "\n".join(
            [
                "set -eu",
                *self._mount_lines(mounts, scratch, hosts_file),
                # $0 is the working folder, "$@" the container's command line.
                f"exec {self.tools['chroot']} {shlex.quote(str(self.root))} "
                '/bin/sh -c \'cd "$0" && exec "$@"\' "$0" "$@"',
            ]
        )
        return [
            self.tools["nsenter"], f"--target={self.pid}", "--mount", "--net", "--",
            self.tools["unshare"], "--mount", "--propagation", "private", "--",
            "/bin/sh", "-c", script, working_dir, *argv,
        ]  # fmt: skip

    def exec_command(self, container_pid: int, argv: Sequence[str]) -> list[str]:
        """`argv` inside a running container (its namespaces, root and working folder), as
        an exec probe or a preStop hook runs."""
        return [
            self.tools["nsenter"], f"--target={container_pid}",
            "--mount", "--net", "--root", "--wd", "--", *argv,
        ]  # fmt: skip

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=10)
