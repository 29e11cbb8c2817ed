"""A real Kubernetes control plane on loopback, built from upstream sources.

No container engine and no prebuilt Kubernetes binary exist on our machines, but Go and
the Go module proxy do. `controlplane/` next to this file is a tiny Go module that
requires k8s.io/kubernetes at one release (and the k8s.io staging modules at the matching
v0.x versions, as k/k's own go.mod replaces them), plus etcd at the version k/k pins.
`build` compiles etcd, kube-apiserver, kube-controller-manager and the node's kube-scheduler,
kube-proxy and kubelet from it into TOOLS/kubernetes-vX.Y.Z/bin.

`ControlPlane` (a context manager) starts the three on 127.0.0.1 with a small CA made by
openssl: TLS everywhere (etcd included), Node and RBAC authorization, PodSecurity
admission, service account tokens, aggregator routing to endpoints, and the controllers
a Deployment/HPA workload needs. It writes an admin kubeconfig and returns once /readyz
is ok and the default ServiceAccount exists. `up`/`down` do the same for processes that
outlive Python (their pids and ports are in STATE/cluster.json), and `up` adds a real node
(hack.node: containerd, kubelet, kube-proxy, kube-scheduler; root needed) that `down` removes
with everything it made.

    python -m hack.cluster build   # once: 10-25 minutes cold on 2 cores
    python -m hack.cluster up      # then: kubectl --kubeconfig .cluster/kubeconfig
    python -m hack.cluster status
    python -m hack.cluster down
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from hack import dns, netpol, node, registry
from tritonscale.local.ports import free_ports, port_is_taken

GO_MODULE_DIR = Path(__file__).resolve().parent / "controlplane"
# Binary name -> Go package, as `go build` takes it from inside GO_MODULE_DIR.
PACKAGES = {
    "etcd": "./etcd",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    # The node's (hack.node): the same module, so the same versions and build cache.
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
}
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager")
# The controllers a Deployment + DaemonSet + Service + HPA + PDB + Job workload needs, and the
# ones that make RBAC, service accounts and quotas behave as in a real cluster: clusterrole-aggregation
# fills admin/edit/view, root-ca-certificate-publisher writes kube-root-ca.crt, and a
# ResourceQuota admits nothing until resourcequota-controller has computed its usage.
CONTROLLERS = (
    "deployment-controller",
    "daemonset-controller",
    "replicaset-controller",
    "job-controller",
    "resourcequota-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "horizontal-pod-autoscaler-controller",
    "disruption-controller",
    "clusterrole-aggregation-controller",
    "root-ca-certificate-publisher-controller",
)
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_CLUSTER_IP = "10.0.0.1"  # the `kubernetes` Service: first address of the range
STATE_FILE = "cluster.json"
PROGRESS_EVERY_S = 15.0


class ClusterError(RuntimeError):
    """The control plane could not be built, started or stopped; one line for a person."""


def kubernetes_version() -> str:
    """The k8s.io/kubernetes release that controlplane/go.mod requires, e.g. "v1.34.4"."""
    match = re.search(
        r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)",
        (GO_MODULE_DIR / "go.mod").read_text(),
        re.MULTILINE,
    )
    if match is None:
        raise ClusterError(f"no k8s.io/kubernetes requirement in {GO_MODULE_DIR / 'go.mod'}")
    return match.group(1)


def bin_dir(tools_dir: Path) -> Path:
    """Where `build` puts the binaries: one folder per release, so upgrades never mix."""
    return Path(tools_dir).resolve() / f"kubernetes-{kubernetes_version()}" / "bin"


def binaries(tools_dir: Path) -> dict[str, Path]:
    return {name: bin_dir(tools_dir) / name for name in PACKAGES}


def dying_with_parent(command: Sequence[str], signal_name: str = "KILL") -> list[str]:
    """COMMAND, started through util-linux's `setpriv --pdeathsig`, which asks the kernel to
    send it SIGKILL (or `signal_name`) when this process dies, then execs it: no component (or
    go build) outlives a crashed or killed run. (Measured here: it outlives the thread that
    started it; only the process's end kills it.) Not a `preexec_fn`: Python code between fork
    and exec is unsafe in a process with threads, and a child once died of a segfault in
    threading's after-fork hook there while a test thread had gevent loaded."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:  # util-linux is essential in Debian; elsewhere, no such guard
        return list(command)
    return [setpriv, "--pdeathsig", signal_name, "--", *command]


# ---------------------------------------------------------------------------- build


def _ldflags(version: str) -> str:
    """Strip symbols, and stamp the release the way k/k's hack/lib/version.sh does, so
    `kubectl version` shows it instead of v0.0.0-master. (The module zip has no git
    commit to stamp: /version shows gitCommit "$Format:%H$".)"""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
        ]
    return " ".join(flags)


def _first_error(output: str) -> str:
    """The first line of go output that says what went wrong (not progress, not a header)."""
    for line in output.splitlines():
        line = line.strip()
        # `go build -v` prints bare package paths; downloads and "# pkg" headers are noise.
        if " " not in line or line.startswith(("# ", "go: downloading", "go: extracting")):
            continue
        return line
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def _copy_module(into: Path) -> Path:
    """A writable copy of the Go module: the package folder may be read-only when installed,
    and go may want to touch go.mod/go.sum."""
    target = into / "controlplane"
    for source in GO_MODULE_DIR.rglob("*"):
        if source.is_file() and (source.suffix == ".go" or source.name in ("go.mod", "go.sum")):
            destination = target / source.relative_to(GO_MODULE_DIR)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
    return target


def _go_build(
    go: str, module: Path, name: str, output: Path, log: Path, progress: Callable[[str], Any]
) -> float:
    """Build one binary into `output`; return the seconds it took."""
    version = kubernetes_version()
    command = [
        go,
        "build",
        "-v",  # one line per compiled package: the progress lines count them
        "-mod=mod",  # go.sum is complete; this lets another go version add what it wants
        "-trimpath",
        # k/k's release flags: static, no debug info, and the tags hack/lib/golang.sh uses.
        "-tags=selinux,notest,grpcnotrace",
        f"-ldflags={_ldflags(version)}",
        "-o",
        str(output),
        PACKAGES[name],
    ]
    return run_go(command, module, name, log, progress)


def run_go(
    command: list[str],
    cwd: Path,
    name: str,
    log: Path,
    progress: Callable[[str], Any],
    env: dict[str, str] | None = None,
) -> float:
    """Run a `go build -v` or `go install -v` COMMAND with a progress line every
    PROGRESS_EVERY_S; return the seconds it took, or raise ClusterError with go's error."""
    env = dict(os.environ, CGO_ENABLED="0", GOWORK="off", **(env or {}))
    started = time.monotonic()
    with open(log, "wb") as log_file:
        # Should we be killed, go dies too instead of building on for minutes.
        process = subprocess.Popen(
            dying_with_parent(command),
            cwd=cwd,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        next_report = started + PROGRESS_EVERY_S
        while process.poll() is None:
            time.sleep(0.5)
            if time.monotonic() >= next_report:
                next_report += PROGRESS_EVERY_S
                # Bare package paths are `-v`'s lines; the rest is downloads and messages.
                lines = log.read_text(errors="replace").splitlines()
                packages = [line for line in lines if line and " " not in line]
                downloads = sum(line.startswith("go: downloading") for line in lines)
                last = f" (last: {packages[-1]})" if packages else ""
                progress(
                    f"  {name}: {time.monotonic() - started:.0f} s, {downloads} modules "
                    f"downloaded, {len(packages)} packages compiled{last}"
                )
    finally:
        if process.poll() is None:  # interrupted: leave no go process behind
            process.kill()
            process.wait()
    if process.returncode != 0:
        raise ClusterError(
            f"go build {name} failed: {_first_error(log.read_text(errors='replace'))}"
        )
    return time.monotonic() - started


def go_install(
    package: str, target: Path, progress: Callable[[str], Any], *, ldflags: str = "-s -w"
) -> Path:
    """`go install PACKAGE@VERSION` (the module's own go.mod and go.sum, checked against the
    checksum database) into the file `target`, or return at once when it is there.
    `ldflags` are the linker's flags (a command's `-X main.Version=...` stamp goes there)."""
    if target.is_file():
        return target
    go = shutil.which("go")
    if go is None:
        raise ClusterError(f"go not found on PATH: install Go to build {package}")
    name = target.name
    target.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time per target (two test workers, say); the others wait here and
    # then find the binary.
    with open(target.with_name(f".{name}.build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():
            return target
        progress(f"building {package} into {target.parent} (minutes cold, seconds cached)")
        with tempfile.TemporaryDirectory(prefix=f"tritonscale-{name}-build-") as scratch:
            command = [go, "install", "-v", "-trimpath", f"-ldflags={ldflags}", package]
            log = Path(scratch) / "build.log"
            seconds = run_go(command, Path(scratch), name, log, progress, env={"GOBIN": scratch})
            built = next(path for path in Path(scratch).iterdir() if path.name != "build.log")
            # Through a name in the final folder: nobody sees a half-written binary.
            partial = target.with_name(f".{name}.partial")
            shutil.copyfile(built, partial)
            partial.chmod(0o755)
            partial.replace(target)
    progress(f"built {name} in {seconds:.0f} s")
    return target


@dataclass(frozen=True)
class GoTool:
    """A pinned Go command the development tooling builds with `go_install` into
    TOOLS/NAME-VERSION/NAME (one folder per release, so an upgrade never finds an older
    binary), failing with `error`: one line for a person."""

    name: str
    package: str  # the command's package path, without @VERSION
    version: str
    ldflags: str
    error: type[Exception]

    def binary(self, tools_dir: Path) -> Path:
        return Path(tools_dir).resolve() / f"{self.name}-{self.version}" / self.name

    def build(self, tools_dir: Path, progress: Callable[[str], Any] = print) -> Path:
        """The binary: built unless it is there already."""
        try:
            return go_install(
                f"{self.package}@{self.version}",
                self.binary(tools_dir),
                progress,
                ldflags=self.ldflags,
            )
        except ClusterError as error:
            raise self.error(str(error)) from None

    def main(self, tools_dir: Path, prefix: str) -> int:
        """`python -m ...build`: print the binary's path, or `prefix: why` and exit 1."""
        try:
            print(self.build(tools_dir, progress=lambda line: print(line, file=sys.stderr)))
        except self.error as error:
            print(f"{prefix}: {error}", file=sys.stderr)
            return 1
        return 0


def build(tools_dir: Path, progress: Callable[[str], Any] = print) -> dict[str, Path]:
    """Build every binary of PACKAGES into TOOLS/kubernetes-vX.Y.Z/bin, CoreDNS (hack.dns),
    the registry (hack.registry) and kube-router (hack.netpol), or return at once when they
    are there already."""
    paths = _build_kubernetes(tools_dir, progress)
    return {
        **paths,
        "coredns": dns.build(tools_dir, progress),
        "registry": registry.build(tools_dir, progress),
        "kube-router": netpol.build(tools_dir, progress),
    }


def _build_kubernetes(tools_dir: Path, progress: Callable[[str], Any]) -> dict[str, Path]:
    paths = binaries(tools_dir)
    if all(path.is_file() for path in paths.values()):
        return paths
    go = shutil.which("go")
    if go is None:
        raise ClusterError("go not found on PATH: install Go 1.24 or newer to build Kubernetes")
    target = bin_dir(tools_dir)
    target.mkdir(parents=True, exist_ok=True)
    # One builder at a time per release; the others wait here and then find the binaries.
    with open(target / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [name for name, path in paths.items() if not path.is_file()]
        if not missing:
            return paths
        progress(
            f"building Kubernetes {kubernetes_version()} ({', '.join(missing)}) into {target}; "
            "on 2 cores a cold build takes 10 to 25 minutes, a cached one under a minute"
        )
        with tempfile.TemporaryDirectory(prefix="tritonscale-k8s-build-") as scratch:
            module = _copy_module(Path(scratch))
            for name in missing:
                # A temporary name in the final folder, then an atomic rename: nobody
                # ever sees a half-written binary.
                partial = target / f".{name}.{os.getpid()}.partial"
                try:
                    seconds = _go_build(
                        go, module, name, partial, Path(scratch) / f"{name}.log", progress
                    )
                    os.replace(partial, paths[name])
                finally:
                    partial.unlink(missing_ok=True)
                size_mb = paths[name].stat().st_size / 2**20
                progress(f"built {name} in {seconds:.0f} s ({size_mb:.0f} MiB)")
    return paths


# ---------------------------------------------------------------------- certificates


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {_first_error(result.stderr)}")


def _new_key(path: Path, algorithm: str = "EC") -> None:
    # P-256 for TLS: instant, where an RSA key takes a visible fraction of a second.
    options = "ec_paramgen_curve:P-256" if algorithm == "EC" else "rsa_keygen_bits:2048"
    _openssl("genpkey", "-algorithm", algorithm, "-pkeyopt", options, "-out", str(path))
    path.chmod(0o600)


def _new_cert(
    pki: Path, name: str, cn: str, *, ca: str = "", org: str = "", usage: str = "", sans: str = ""
) -> None:
    """PKI/NAME.key and PKI/NAME.crt: self-signed CA when `ca` is empty, else a leaf signed
    by PKI/CA.crt with extended key `usage` (serverAuth, clientAuth) and `sans`."""
    if ca:
        extensions = [
            "basicConstraints = critical, CA:FALSE",
            "keyUsage = critical, digitalSignature",
            f"extendedKeyUsage = {usage}",
            "authorityKeyIdentifier = keyid",
        ]
        if sans:
            extensions.append(f"subjectAltName = {sans}")
        signer = ["-CA", str(pki / f"{ca}.crt"), "-CAkey", str(pki / f"{ca}.key")]
    else:
        extensions = [
            "basicConstraints = critical, CA:TRUE",
            "keyUsage = critical, keyCertSign, cRLSign, digitalSignature",
            "subjectKeyIdentifier = hash",
        ]
        signer = []
    # A config of our own, so nothing from the system's openssl.cnf gets in.
    subject = [f"CN = {cn}", *([f"O = {org}"] if org else [])]
    config = pki / f"{name}.cnf"
    config.write_text(
        "\n".join(
            ["[req]", "distinguished_name = dn", "prompt = no", "[dn]", *subject, "[ext]"]
            + [*extensions, ""]
        )
    )
    _new_key(pki / f"{name}.key")
    # `req -x509 -CA` (OpenSSL 3) makes and signs the certificate in one call.
    _openssl(
        "req", "-x509", "-new", "-key", str(pki / f"{name}.key"), *signer,
        "-config", str(config), "-extensions", "ext", "-days", "3650",
        # A positive random serial: Go rejects negative ones, browsers repeated ones.
        "-set_serial", f"0x{secrets.randbits(120):x}",
        "-out", str(pki / f"{name}.crt"),
    )  # fmt: skip


def _make_pki(pki: Path, advertise_address: str | None = None) -> None:
    """The CAs, keys and certificates of one cluster, all fresh. The API server's certificate
    also names `advertise_address`, where pods reach it through the `kubernetes` Service."""
    if shutil.which("openssl") is None:
        raise ClusterError("openssl not found on PATH: apt-get install openssl")
    pki.mkdir(parents=True, exist_ok=True)
    _new_cert(pki, "ca", "tritonscale-local-ca")
    # The aggregator's front proxy gets its own CA, as in kubeadm: a client certificate
    # from the main CA must not be able to pose as the proxy and assert any user.
    _new_cert(pki, "front-proxy-ca", "tritonscale-local-front-proxy-ca")
    local = "IP:127.0.0.1, DNS:localhost"
    node = f", IP:{advertise_address}" if advertise_address else ""
    in_cluster = ", ".join(
        f"DNS:{name}"
        for name in (
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )
    )
    server, client = "serverAuth, clientAuth", "clientAuth"
    _new_cert(pki, "apiserver", "kube-apiserver", ca="ca", usage=server,
              sans=f"{local}{node}, IP:{SERVICE_CLUSTER_IP}, {in_cluster}")  # fmt: skip
    _new_cert(pki, "etcd", "etcd", ca="ca", usage=server, sans=local)
    _new_cert(pki, "apiserver-etcd-client", "kube-apiserver-etcd-client", ca="ca", usage=client)
    _new_cert(pki, "admin", "tritonscale-admin", ca="ca", org="system:masters", usage=client)
    _new_cert(pki, "controller-manager", "system:kube-controller-manager", ca="ca", usage=client)
    _new_cert(pki, "front-proxy-client", "front-proxy-client", ca="front-proxy-ca", usage=client)
    # The API server's identity towards kubelets (logs, exec, port-forward): the kubelet's
    # webhook authorizer asks the API server, and system:masters may do all of it.
    _new_cert(pki, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ca="ca",
              org="system:masters", usage=client)  # fmt: skip
    # The service account signing key: RSA, which every token consumer understands.
    _new_key(pki / "sa.key", "RSA")
    _openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def _kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    """A kubeconfig with everything embedded (JSON is valid YAML, so json does it)."""

    def data(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "tritonscale-local",
                "cluster": {"server": server, "certificate-authority-data": data("ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": data(f"{user}.crt"),
                    "client-key-data": data(f"{user}.key"),
                },
            }
        ],
        "contexts": [
            {"name": "tritonscale-local", "context": {"cluster": "tritonscale-local", "user": user}}
        ],
        "current-context": "tritonscale-local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(config, indent=2) + "\n")
    partial.chmod(0o600)
    os.replace(partial, path)


# ------------------------------------------------------------------------- processes


def _last_meaningful_line(log: Path) -> str:
    """What a person needs from a dead component's log: its last error, else its last line."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    except FileNotFoundError:
        return "no log"
    for line in reversed(lines):
        # etcd logs JSON lines (zap).
        if line.startswith("{") and re.search(r'"level":"(error|fatal|panic)"', line):
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                return " ".join(str(entry[k]) for k in ("msg", "error") if k in entry)
        # klog E/F lines, cobra's "Error: unknown flag", Go panics.
        if re.match(r"[EF]\d{4} ", line) or line.startswith(("Error:", "panic:")):
            return line
    # A bad flag: the message comes before the usage text.
    if "Usage:" in lines:
        lines = lines[: lines.index("Usage:")]
    lines = [line for line in lines if line]
    return lines[-1] if lines else "empty log"


def _is_running(pid: int, binary: str) -> bool:
    """True while `pid` is a live (not zombie) process running `binary`: a recorded pid
    may have been reused by an unrelated process since."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (FileNotFoundError, ProcessLookupError, UnicodeDecodeError):
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X") and cmdline == binary


def _stop_pids(
    pids: dict[str, int], binaries_by_name: dict[str, str], grace_s: float
) -> dict[str, int]:
    """SIGTERM each component's process group, SIGKILL what is left after `grace_s`, and
    verify that none remains; return the ones that were running."""
    live = {name: pid for name, pid in pids.items() if _is_running(pid, binaries_by_name[name])}
    running = dict(live)
    for pid in live.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live = {n: p for n, p in live.items() if _is_running(p, binaries_by_name[n])}
    for pid in live.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live = {n: p for n, p in live.items() if _is_running(p, binaries_by_name[n])}
    if live:
        raise ClusterError(f"could not stop {', '.join(f'{n} (pid {p})' for n, p in live.items())}")
    return running


def _stop_components(
    pids: dict[str, int], binaries_by_name: dict[str, str], grace_s: float
) -> dict[str, int]:
    """etcd last: an apiserver whose etcd is gone takes longer than the grace to shut down,
    where it needs ~1 s otherwise. Return the components that were running."""
    first = _stop_pids({n: p for n, p in pids.items() if n != "etcd"}, binaries_by_name, grace_s)
    last = _stop_pids({n: p for n, p in pids.items() if n == "etcd"}, binaries_by_name, grace_s)
    return {**first, **last}


def _remove_state(state_dir: Path, kubeconfig: Path) -> None:
    """Remove what a cluster keeps in state_dir; only our own paths, as state_dir may hold
    other things."""
    for name in ("pki", "etcd", "logs", "controller-manager"):
        shutil.rmtree(state_dir / name, ignore_errors=True)
    for name in (STATE_FILE, "controller-manager.kubeconfig"):
        (state_dir / name).unlink(missing_ok=True)
    kubeconfig.unlink(missing_ok=True)


class ControlPlane:
    """etcd, kube-apiserver and kube-controller-manager on 127.0.0.1, fresh at each start.

    `state_dir` holds the certificates, etcd's data, the logs (logs/NAME.log), cluster.json
    and, unless `kubeconfig` says otherwise, the admin kubeconfig. Ports left at 0 are
    picked free. `extra_args` adds flags per component, e.g.
    {"kube-controller-manager": ["--horizontal-pod-autoscaler-sync-period=2s"]}.
    With `detach`, the processes do not die with this Python process (see `up`).

    Alone, the API server listens on 127.0.0.1 only. With `advertise_address` (the node's
    address, given when a node joins) it listens on every address and advertises that one:
    the `kubernetes` Service's endpoint, which kube-proxy routes pods' in-cluster clients
    to (the operator's pod among them).
    """

    def __init__(
        self,
        state_dir: Path = Path(".cluster"),
        tools_dir: Path = Path(".tools"),
        *,
        kubeconfig: Path | None = None,
        apiserver_port: int = 0,
        etcd_port: int = 0,
        etcd_peer_port: int = 0,
        controller_manager_port: int = 0,
        extra_args: dict[str, list[str]] | None = None,
        startup_timeout_s: float = 180.0,
        stop_grace_s: float = 5.0,
        detach: bool = False,
        advertise_address: str | None = None,
        progress: Callable[[str], Any] = lambda _line: None,
    ) -> None:
        self.advertise_address = advertise_address
        self.state_dir = Path(state_dir).resolve()
        self.tools_dir = Path(tools_dir)
        self.kubeconfig = Path(kubeconfig or self.state_dir / "kubeconfig").resolve()
        self.requested_ports = {
            "apiserver": apiserver_port,
            "etcd": etcd_port,
            "etcd-peer": etcd_peer_port,
            "controller-manager": controller_manager_port,
        }
        self.ports: dict[str, int] = {}
        self.extra_args = extra_args or {}
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.detach = detach
        self.progress = progress
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.programs: dict[str, str] = {}  # each component's binary (setpriv may run it)
        self.start_seconds: float | None = None
        self._context: ssl.SSLContext | None = None

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def log_path(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    def _pick_ports(self) -> None:
        self.ports = {}
        drawn = iter(free_ports(sum(not port for port in self.requested_ports.values())))
        for role, port in self.requested_ports.items():
            if port and port_is_taken(port):
                raise ClusterError(f"port {port} ({role}) is already in use on 127.0.0.1")
            self.ports[role] = port or next(drawn)

    def _commands(self, paths: dict[str, Path]) -> dict[str, list[str]]:
        pki, ports = self.pki, self.ports
        etcd_url = f"https://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
        return {
            "etcd": [
                str(paths["etcd"]),
                "--name=tritonscale-local",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                # A single member: the peer port only has to be ours, never carries data.
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=tritonscale-local={peer_url}",
                "--initial-cluster-state=new",
                f"--cert-file={pki / 'etcd.crt'}",
                f"--key-file={pki / 'etcd.key'}",
                "--client-cert-auth=true",
                f"--trusted-ca-file={pki / 'ca.crt'}",
                # Throwaway data: fsync only slows a test cluster down.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            "kube-apiserver": [
                str(paths["kube-apiserver"]),
                f"--bind-address={'0.0.0.0' if self.advertise_address else '127.0.0.1'}",
                f"--advertise-address={self.advertise_address or '127.0.0.1'}",
                f"--secure-port={ports['apiserver']}",
                f"--etcd-servers={etcd_url}",
                f"--etcd-cafile={pki / 'ca.crt'}",
                f"--etcd-certfile={pki / 'apiserver-etcd-client.crt'}",
                f"--etcd-keyfile={pki / 'apiserver-etcd-client.key'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                # Added to the default plugins (PodSecurity is one of them already; naming
                # it keeps it on should the defaults change). NodeRestriction goes with
                # the Node authorizer.
                "--enable-admission-plugins=NodeRestriction,PodSecurity",
                # As on kubeadm clusters: PodSecurity, not this flag, decides what may run.
                "--allow-privileged=true",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # Aggregated APIs (metrics, custom metrics) are reached at their endpoints:
                # there is no kube-proxy to route a Service's cluster IP.
                "--enable-aggregator-routing=true",
                # Alone, the `kubernetes` Service's Endpoints would be 127.0.0.1, which
                # Endpoints validation rejects (every 10 s, in the log): keep the Service
                # without them. With a node, the lease reconciler lists the advertised address.
                f"--endpoint-reconciler-type={'lease' if self.advertise_address else 'none'}",
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                # Kubelets are reached at their node's InternalIP (the node's --node-ip),
                # checked against the cluster's CA, as the kubelet client above.
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={pki / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP",
                "--profiling=false",
            ],
            "kube-controller-manager": [
                str(paths["kube-controller-manager"]),
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['controller-manager']}",
                f"--cert-dir={self.state_dir / 'controller-manager'}",
                f"--kubeconfig={self.state_dir / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={self.state_dir / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={self.state_dir / 'controller-manager.kubeconfig'}",
                f"--controllers={','.join(CONTROLLERS)}",
                # Each controller acts as its own service account, so RBAC is exercised
                # as in a real cluster.
                "--use-service-account-credentials=true",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                # One instance: leader election would only delay the start.
                "--leader-elect=false",
                "--profiling=false",
            ],
        }

    def _spawn(self, name: str, command: list[str]) -> None:
        with open(self.log_path(name), "ab") as log:
            command = [*command, *self.extra_args.get(name, [])]
            self.programs[name] = str(command[0])
            self.processes[name] = subprocess.Popen(
                command if self.detach else dying_with_parent(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                # Its own session and process group: stop() signals the whole group, and a
                # detached cluster takes no signal meant for our terminal.
                start_new_session=True,
            )

    def _check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise ClusterError(
                    f"{name} exited during start (code {process.returncode}): "
                    f"{_last_meaningful_line(self.log_path(name))} "
                    f"(log: {self.log_path(name)})"
                )

    def _ssl_context(self) -> ssl.SSLContext:
        if self._context is None:
            self._context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
            self._context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return self._context

    def get(self, path: str, timeout_s: float = 2.0) -> tuple[int, str]:
        """GET `path` from the apiserver as the admin: (status, body); (0, error) when the
        connection fails."""
        try:
            with urllib.request.urlopen(
                self.server + path, timeout=timeout_s, context=self._ssl_context()
            ) as response:
                return response.status, response.read().decode(errors="replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")
        except (OSError, ssl.SSLError) as error:
            return 0, str(error)

    def _wait(self, what: str, ready: Callable[[], bool], deadline: float) -> None:
        while not ready():
            self._check_alive()
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"timed out after {self.startup_timeout_s:.0f} s waiting for {what} "
                    f"(logs: {self.state_dir / 'logs'})"
                )
            time.sleep(0.2)

    def start(self) -> ControlPlane:
        paths = binaries(self.tools_dir)
        missing = [name for name, path in paths.items() if not path.is_file()]
        if missing:
            raise ClusterError(
                f"{', '.join(missing)} not built in {bin_dir(self.tools_dir)}: run "
                f"`python -m hack.cluster build --tools-dir {self.tools_dir}`"
            )
        self._pick_ports()
        _remove_state(self.state_dir, self.kubeconfig)  # each start is a fresh cluster
        self._context = None
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        _make_pki(self.pki, self.advertise_address)
        _kubeconfig(self.kubeconfig, self.server, self.pki, "admin")
        _kubeconfig(
            self.state_dir / "controller-manager.kubeconfig",
            self.server,
            self.pki,
            "controller-manager",
        )
        commands = self._commands(paths)
        started = time.monotonic()
        deadline = started + self.startup_timeout_s
        try:
            self._spawn("etcd", commands["etcd"])
            self._spawn("kube-apiserver", commands["kube-apiserver"])
            self._write_state()  # from here on, `down` can clean up whatever happens
            self._wait(
                "kube-apiserver /readyz", lambda: self.get("/readyz") == (200, "ok"), deadline
            )
            # After /readyz: the controller-manager gives up when the apiserver is slow.
            self._spawn("kube-controller-manager", commands["kube-controller-manager"])
            self._write_state()
            self._wait(
                "the default ServiceAccount",
                lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
                deadline,
            )
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        self.progress(f"control plane ready in {self.start_seconds:.1f} s at {self.server}")
        return self

    def _write_state(self) -> None:
        state = {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "ports": self.ports,
            "pids": {name: process.pid for name, process in self.processes.items()},
            "binaries": {name: self.programs[name] for name in self.processes},
            "logs": str(self.state_dir / "logs"),
        }
        partial = self.state_dir / f".{STATE_FILE}.partial"
        partial.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(partial, self.state_dir / STATE_FILE)

    def stop(self) -> None:
        """Stop every component (SIGTERM, SIGKILL after stop_grace_s); keep the logs."""
        processes, self.processes = self.processes, {}
        if processes:
            _stop_components(
                {name: process.pid for name, process in processes.items()},
                {name: self.programs[name] for name in processes},
                self.stop_grace_s,
            )
            for process in processes.values():
                process.wait(timeout=5)  # reap: they are dead by now
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# ------------------------------------------------------------- detached: up / down


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None


def _running(state: dict[str, Any]) -> dict[str, int]:
    return {
        name: pid
        for name, pid in state["pids"].items()
        if _is_running(pid, state["binaries"][name])
    }


def _node_running(state_dir: Path) -> bool:
    state = node.read_state(state_dir)
    if state is None:
        return True  # a cluster started without a node
    return all(_is_running(pid, state["binaries"][n]) for n, pid in state["pids"].items())


def restart(
    state_dir: Path, name: str, down_s: float = 0.0, grace_s: float = 30.0
) -> tuple[int, int]:
    """Stop one component of the running cluster of STATE (SIGTERM to its process alone: a
    container runtime's shims and containers stay; SIGKILL after `grace_s`), keep it down
    `down_s` seconds, and start it again as it ran (same command line, folder and log);
    (old pid, new pid). For the day-2 drills: an API server, a kubelet or containerd that
    restarts under load."""
    state_dir = Path(state_dir).resolve()
    for state_file in (state_dir / STATE_FILE, state_dir / node.STATE_FILE):
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        if name in state.get("pids", {}):
            break
    else:
        raise ClusterError(f"the cluster of {state_dir} has no component {name}")
    pid, binary = state["pids"][name], state["binaries"][name]
    if not _is_running(pid, binary):
        raise ClusterError(f"{name} (pid {pid}) is not running")
    command = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
    folder = os.readlink(f"/proc/{pid}/cwd")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _is_running(pid, binary):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    time.sleep(down_s)
    with open(state_dir / "logs" / f"{name}.log", "ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=folder,
            start_new_session=True,
        )
    state["pids"][name] = process.pid
    partial = state_file.with_name(f".{state_file.name}.partial")
    partial.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(partial, state_file)
    return pid, process.pid


def up(
    state_dir: Path = Path(".cluster"),
    tools_dir: Path = Path(".tools"),
    progress: Callable[[str], Any] = print,
    with_node: bool = True,
) -> dict[str, Any]:
    """Build if needed, then start a control plane and (`with_node`) a node (hack.node) that
    outlive this process; return cluster.json. When one is up already, say so and return its
    state. What a crashed run left is removed first."""
    state = _read_state(state_dir)
    if state is not None:
        if len(_running(state)) == len(CONTROL_PLANE) and _node_running(state_dir):
            progress(f"cluster already up at {state['server']} (kubeconfig {state['kubeconfig']})")
            return state
        down(state_dir, progress=lambda _line: None)  # a half-dead one: clear it first
    build(tools_dir, progress)
    # The kubelet registers its node tainted not-ready; node-lifecycle-controller lifts the
    # taint once the node is Ready (a repeated --controllers adds to the list).
    extra = {"kube-controller-manager": ["--controllers=node-lifecycle-controller"]}
    address = node.node_ip() if with_node else None
    plane = ControlPlane(
        state_dir,
        tools_dir,
        detach=True,
        progress=progress,
        extra_args=extra if with_node else {},
        advertise_address=address,
    )
    plane.start()
    if with_node:
        try:
            node.start_node(state_dir, tools_dir, plane.server, progress)
            dns.deploy(state_dir, tools_dir, plane.server, address, progress)
            netpol.start(state_dir, tools_dir, plane.server, progress)
        except BaseException:
            node.stop_node(state_dir, progress=lambda _line: None)
            plane.stop()
            raise
    progress(f"cluster up: kubectl --kubeconfig {plane.kubeconfig} get nodes")
    return _read_state(state_dir) or {}


def down(state_dir: Path = Path(".cluster"), progress: Callable[[str], Any] = print) -> None:
    """Stop the components recorded in STATE/cluster.json, verify that none remains, and
    remove the state. When no cluster is up, say so."""
    state_dir = Path(state_dir)
    # The node first, and always: a run that crashed before cluster.json was written may
    # have left a node's processes, mounts, namespaces or chains.
    node.stop_node(state_dir, progress)
    state = _read_state(state_dir)
    if state is None:
        progress(f"no cluster up in {state_dir}")
        return
    stopped = _stop_components(state["pids"], state["binaries"], grace_s=5.0)
    _remove_state(state_dir, Path(state["kubeconfig"]))
    with contextlib.suppress(OSError):
        state_dir.rmdir()  # only when nothing of anyone else's is left in it
    if stopped:
        progress(f"cluster down: stopped {', '.join(f'{n} (pid {p})' for n, p in stopped.items())}")
    else:
        progress(f"cluster down: nothing was running any more; removed its state in {state_dir}")


def status(state_dir: Path = Path(".cluster"), progress: Callable[[str], Any] = print) -> bool:
    """Print each component's state; True when all run and /readyz is ok."""
    state = _read_state(state_dir)
    if state is None:
        progress(f"no cluster up in {state_dir}")
        return False
    running = _running(state)
    for name, pid in state["pids"].items():
        progress(f"{name}: pid {pid} {'running' if name in running else 'NOT running'}")
    node_state = node.read_state(state_dir) or {"pids": {}, "binaries": {}}
    for name, pid in node_state["pids"].items():
        alive = _is_running(pid, node_state["binaries"][name])
        progress(f"{name}: pid {pid} {'running' if alive else 'NOT running'}")
    plane = ControlPlane(state_dir)
    plane.ports = state["ports"]
    readyz = plane.get("/readyz")
    answer = readyz[1] if readyz[0] == 200 else f"HTTP {readyz[0]}: {readyz[1].strip()[:200]}"
    progress(f"{state['server']}/readyz: {answer if readyz[0] else 'unreachable'}")
    progress(f"kubeconfig: {state['kubeconfig']}")
    return len(running) == len(CONTROL_PLANE) and _node_running(state_dir) and readyz == (200, "ok")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.cluster", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("command", choices=("build", "up", "down", "status"))
    parser.add_argument("--state-dir", type=Path, default=Path(".cluster"))
    parser.add_argument("--tools-dir", type=Path, default=Path(".tools"))
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            for path in build(args.tools_dir).values():
                print(path)
        elif args.command == "up":
            up(args.state_dir, args.tools_dir)
        elif args.command == "down":
            down(args.state_dir)
        else:
            return 0 if status(args.state_dir) else 1
    except (ClusterError, node.NodeError, registry.RegistryError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
