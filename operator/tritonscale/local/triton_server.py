"""A real tritonserver on this machine, from the `nvidia-pytriton` wheel.

`nvidia-pytriton==0.7.0` ships tritonserver 2.51.0 (the NGC 24.10 image's version), the
Python backend and one backend stub per Python version. `LocalTriton` assembles a private
backend folder with the stub for the running Python, starts the server in explicit model
control mode with every model loaded and the model-repository API locked behind a header,
waits until each model is ready, and stops the whole process group on exit so that no
stub outlives the server. It listens on loopback unless told otherwise. Tests, the demo, the
benchmarks and `tritonscale serve` use it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tritonscale import GRPC_REPOSITORY_KEY_HEADER, REPOSITORY_KEY_ENV, REPOSITORY_KEY_HEADER
from tritonscale.local.ports import LOOPBACK, free_port, free_ports, port_is_taken
from tritonscale.triton.client import TritonClient, TritonError
from tritonscale.triton.endpoints import Endpoint

# Triton's APIs locked behind the repository key (as the chart does): loading code, and the
# ones that change the server's state. Inference, health, metadata, config and statistics
# stay open.
RESTRICTED_APIS = "model-repository,shared-memory,logging,trace"

# Triton's rate limiter in the mode where each payload is scheduled when an instance is free
# (`--rate-limit=execution_count`), not in the default `off`. In `off` a new instance's
# initialization (and a removed one's exit) waits in a queue that its backend thread reads
# only once the model's queue of batches is empty: under a load that never drains, a BLS
# root's count change never finished (docs/count-changes.md has the source and the numbers).
RATE_LIMIT = "execution_count"

# The model repository when none is named: models/ in the current directory (a checkout).
DEFAULT_MODEL_REPOSITORY = Path("models")


# Starts on freshly chosen ports when another process took one of ours first (start()).
# Starts tried before giving up: a port taken meanwhile, or a crash while loading (below).
START_ATTEMPTS = 3
# What a crashed tritonserver or stub leaves at the end of its log: C++'s terminate handler.
CRASH_MARKERS = ("terminate called", "what():")
WILDCARDS = {"0.0.0.0", "::"}  # listening on every address overlaps with any one of them


class LocalTritonError(RuntimeError):
    """The local server could not start or stay up; the message is one line for a person."""


class TritonCrashedWhileStarting(LocalTritonError):
    """tritonserver died from a signal before its models were ready.

    Triton 2.51's Python backend can abort the whole server while it starts many stubs at
    once on a busy machine (`terminate called after throwing an instance of
    'boost::interprocess::lock_exception'`, from a stub launch; seen with both cores busy, a
    known upstream crash). Like a kubelet restarting a crashed container, `start` starts it
    again, and says so in the server's log.
    """


# Where the Python backend keeps its shared-memory regions (one per model instance).
SHARED_MEMORY = Path("/dev/shm")


def _listen_address(name: str, address: str) -> str:
    """address, when this machine can listen on it; else a one-line error naming the option."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise LocalTritonError(
            f"{name} address {address!r} is not an IP address (e.g. 127.0.0.1 or 0.0.0.0)"
        ) from None
    try:
        free_port(address)
    except OSError as error:
        raise LocalTritonError(
            f"cannot listen on {name} address {address}: {error.strerror or error}"
        ) from None
    return address


def _url_host(address: str) -> str:
    """How a client on this machine reaches a server bound to address."""
    if address == "0.0.0.0":
        return LOOPBACK
    if address == "::":
        return "[::1]"
    return f"[{address}]" if ":" in address else address


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


class TritonInstall:
    """Where the wheel put the server, its libraries, the Python backend and the stubs."""

    def __init__(self) -> None:
        package = _package_dir("pytriton")
        if package is None:
            raise LocalTritonError(
                "tritonserver not found: install the server extra "
                "(pip install 'tritonscale[server]', which brings nvidia-pytriton==0.7.0)"
            )
        root = package / "tritonserver"
        self.binary = root / "bin" / "tritonserver"
        self.python_backend = root / "backends" / "python"
        self.libraries = package.parent / "nvidia_pytriton.libs"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        self.stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not self.binary.is_file():
            raise LocalTritonError(f"tritonserver binary missing at {self.binary}")
        if not self.stub.is_file():
            raise LocalTritonError(
                f"no Python backend stub for Python {version} in nvidia-pytriton "
                f"(looked for {self.stub}); use a Python it ships a stub for (3.8-3.13)"
            )

    def make_backend_directory(self, into: Path) -> Path:
        """A private backend folder: the Python backend plus the stub for this Python.

        The stub must sit beside libtriton_python.so; we link rather than write into
        site-packages, which may be read-only or shared by several Pythons.
        """
        python = into / "python"
        python.mkdir(parents=True)
        for item in self.python_backend.iterdir():
            if item.name != "__pycache__":
                (python / item.name).symlink_to(item)
        (python / "triton_python_backend_stub").symlink_to(self.stub)
        return into


class LocalTriton:
    """A tritonserver process on `model_repository`; use it as a context manager.

    Ports default to Triton's own (8000/8001/8002); pass 0 for a free port each. Each
    server listens on loopback (127.0.0.1) unless given another address, e.g. 0.0.0.0 to be
    reached from other machines. `models=None` loads every model of the repository
    (`--load-model=*`).
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str] = DEFAULT_MODEL_REPOSITORY,
        *,
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        http_address: str = LOOPBACK,
        grpc_address: str = LOOPBACK,
        metrics_address: str = LOOPBACK,
        repository_key: str | None = None,
        models: list[str] | None = None,
        summary_latencies: bool = True,
        exit_timeout_s: int = 10,
        startup_timeout_s: float = 240.0,
        log_path: str | os.PathLike[str] | None = None,
        extra_args: list[str] | None = None,
        rate_limit: str = RATE_LIMIT,
    ) -> None:
        self.model_repository = Path(model_repository).resolve()
        self.http_address = _listen_address("HTTP", http_address)
        self.grpc_address = _listen_address("gRPC", grpc_address)
        self.metrics_address = _listen_address("metrics", metrics_address)
        # Ports asked as 0 (all three) are this object's choice, and may be chosen again
        # (start()); ports the caller named are the caller's to change.
        self._free_ports = not (http_port or grpc_port or metrics_port)
        if self._free_ports:
            self._choose_ports()
        else:
            # The ones left at 0 beside a named one are drawn together too (free_ports).
            asked = [
                (http_port, self.http_address),
                (grpc_port, self.grpc_address),
                (metrics_port, self.metrics_address),
            ]
            missing = [address for port, address in asked if not port]
            drawn = iter(free_ports(len(missing), missing))
            self.http_port, self.grpc_port, self.metrics_port = (
                port or next(drawn) for port, _ in asked
            )
        self.repository_key = (
            repository_key or os.environ.get(REPOSITORY_KEY_ENV) or secrets.token_urlsafe(24)
        )
        self.models = models
        self.summary_latencies = summary_latencies
        self.exit_timeout_s = exit_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = list(extra_args or [])
        self.rate_limit = (
            rate_limit  # `off` is Triton's default: the count-change benchmark's baseline
        )
        # The Python backend names its /dev/shm regions with this prefix: this server's own.
        self.shm_prefix = f"tritonscale_{secrets.token_hex(6)}_"
        self._workdir: Path | None = None
        self._log_path = Path(log_path) if log_path else None
        self._log_file = None
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    # ---- addresses -------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"{_url_host(self.http_address)}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{_url_host(self.grpc_address)}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{_url_host(self.metrics_address)}:{self.metrics_port}/metrics"

    @property
    def repository_headers(self) -> dict[str, str]:
        """The HTTP header that unlocks the model-repository API (load, unload, index)."""
        return {REPOSITORY_KEY_HEADER: self.repository_key}

    @property
    def grpc_repository_headers(self) -> dict[str, str]:
        """The same over gRPC, where Triton expects the key under a prefixed name."""
        return {GRPC_REPOSITORY_KEY_HEADER: self.repository_key}

    @property
    def log_path(self) -> Path:
        assert self._log_path is not None, "the server has not been started"
        return self._log_path

    # ---- life cycle ------------------------------------------------------------------
    def command(self, backend_directory: Path) -> list[str]:
        restricted = f"{RESTRICTED_APIS}:{REPOSITORY_KEY_HEADER}={self.repository_key}"
        args = [
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backend_directory}",
            "--model-control-mode=explicit",
            f"--http-address={self.http_address}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.grpc_address}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.metrics_address}",
            f"--metrics-port={self.metrics_port}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--http-restricted-api={restricted}",
            f"--grpc-restricted-protocol={restricted}",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--rate-limit={self.rate_limit}",
            # Keep going when one model fails so that we can name it and Triton's reason.
            "--exit-on-error=false",
            "--strict-readiness=true",
        ]
        if self.summary_latencies:
            args.append("--metrics-config=summary_latencies=true")
        if self.models is None:
            args.append("--load-model=*")
        else:
            args += [f"--load-model={name}" for name in self.models]
        return [str(TritonInstall().binary), *args, *self.extra_args]

    def start(self) -> LocalTriton:
        if not self.model_repository.is_dir():
            raise LocalTritonError(f"model repository not found: {self.model_repository}")
        if not any(entry.is_dir() for entry in self.model_repository.iterdir()):
            raise LocalTritonError(f"model repository has no models: {self.model_repository}")
        clash = self._port_clash()
        if clash:
            raise LocalTritonError(clash)
        install = TritonInstall()
        for name, address, port in self._listeners():
            try:
                taken = port_is_taken(port, address)
            except OSError as error:
                raise LocalTritonError(
                    f"cannot listen on {name} port {port} at {address}: {error.strerror or error}"
                ) from None
            if taken and self._free_ports:
                self._choose_ports()
                break
            if taken:
                raise LocalTritonError(
                    f"{name} port {port} is already in use (another tritonserver?); "
                    f"choose another with --{name.lower()}-port"
                )
        self._workdir = Path(tempfile.mkdtemp(prefix="tritonscale-"))
        if self._log_path is None:
            self._log_path = self._workdir / "tritonserver.log"
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._launch(install, append_log=attempt > 1)
                return self
            except TritonCrashedWhileStarting as error:
                if attempt == START_ATTEMPTS:
                    raise
                self._note(f"{error}; starting it again (attempt {attempt + 1})")
            except LocalTritonError as error:
                # A free port is free when chosen, not when Triton binds it (after loading
                # the models, seconds later): another process may take it meanwhile (seen
                # with a dozen servers starting at once). Ports of our own choice are chosen
                # again.
                if not (self._free_ports and "already in use" in str(error)):
                    raise
                if attempt == START_ATTEMPTS:
                    raise
                self._choose_ports()
        raise AssertionError("unreachable")

    def _choose_ports(self) -> None:
        self.http_port, self.grpc_port, self.metrics_port = free_ports(
            3, [self.http_address, self.grpc_address, self.metrics_address]
        )

    def _listeners(self) -> list[tuple[str, str, int]]:
        """(name, address, port) of the three servers Triton starts."""
        return [
            ("HTTP", self.http_address, self.http_port),
            ("gRPC", self.grpc_address, self.grpc_port),
            ("metrics", self.metrics_address, self.metrics_port),
        ]

    def _port_clash(self) -> str | None:
        """Why two of the three would listen on one port, which Triton refuses; else None."""
        listeners = self._listeners()
        for i, (name, address, port) in enumerate(listeners):
            for other, other_address, other_port in listeners[i + 1 :]:
                overlap = address == other_address or {address, other_address} & WILDCARDS
                if port == other_port and overlap:
                    return (
                        f"the {name} and {other} ports are both {port}; each needs its own "
                        f"(--{name.lower()}-port, --{other.lower()}-port)"
                    )
        return None

    def _launch(self, install: TritonInstall, append_log: bool) -> None:
        """Start tritonserver on this object's ports and wait until its models are ready."""
        assert self._workdir is not None and self._log_path is not None
        backends = install.make_backend_directory(self._workdir / "backends")
        self._log_file = open(self._log_path, "ab" if append_log else "wb")  # noqa: SIM115 - closed in stop()

        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(install.libraries), env.get("LD_LIBRARY_PATH", "")) if p
        )
        # The stub's embedded interpreter takes its prefix from the first python3 on
        # PATH: put this environment's first so models import its numpy.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        started = time.monotonic()
        self.process = subprocess.Popen(
            self.command(backends),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: stubs die with it
        )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started

    def _repository_index(self) -> list[dict]:
        """Triton's model index, on a connection closed right after the answer.

        A keep-alive connection left open holds Triton's shutdown until its exit timeout,
        unloading no model: the client is closed as soon as it has answered.
        """
        endpoint = Endpoint("local", self.http_url)
        with TritonClient(endpoint, self.repository_key, timeout_s=5) as triton:
            return triton.repository_index()

    def ready_models(self) -> list[str]:
        """The names of the models that are ready, sorted."""
        return sorted(
            row["name"] for row in self._repository_index() if row.get("state") == "READY"
        )

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                crashed = TritonCrashedWhileStarting if code < 0 else LocalTritonError
                raise crashed(f"tritonserver exited with code {code}: {self.last_error()}")
            try:
                states = self._repository_index()
            except TritonError:  # not listening yet, or not answering yet
                time.sleep(0.25)
                continue
            wanted = self.models
            rows = [row for row in states if wanted is None or row["name"] in wanted]
            failed = [row for row in rows if row.get("state") == "UNAVAILABLE"]
            if failed:
                row = failed[0]
                # Python backend reasons carry a traceback after the first line.
                reason = (row.get("reason") or "no reason given").strip().splitlines()[0]
                raise LocalTritonError(
                    f"model '{row['name']}' failed to load: {reason} (log: {self.log_path})"
                )
            absent = sorted(set(wanted or ()) - {row["name"] for row in states})
            if absent:
                raise LocalTritonError(f"model '{absent[0]}' not found in {self.model_repository}")
            # A folder Triton could not read is listed without a state.
            unread = [row["name"] for row in rows if "state" not in row]
            if unread:
                raise LocalTritonError(self._poll_failure(unread[0]))
            loading = [row for row in rows if row["state"] != "READY"]
            if rows and not loading:
                return
            time.sleep(0.25)
        raise LocalTritonError(
            f"tritonserver not ready after {self.startup_timeout_s:.0f} s; log: {self.log_path}"
        )

    def _poll_failure(self, name: str) -> str:
        """Triton leaves a folder it cannot read out of its index; its log says why."""
        marker = f"Poll failed for model directory '{name}': "
        for line in self.log_path.read_text(errors="replace").splitlines():
            if marker in line:
                reason = line.split(marker, 1)[1].rstrip('"')
                return f"model '{name}' failed to load: {reason}"
        return f"model '{name}' failed to load: Triton did not list it (log: {self.log_path})"

    def last_error(self) -> str:
        """The most telling line of the server's log, for a one-line error."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "no log"
        usage = next(
            (i for i, line in enumerate(lines[:5]) if line.startswith("Usage: tritonserver")), None
        )
        if usage is not None:
            # A command line Triton refused. An option it does not know is named before its
            # usage, a value it rejects after it; the usage's own lines are indented or are
            # headings ending in ':' (and hold words like "error" the patterns below would pick).
            before = [line.strip() for line in lines[:usage] if line.strip()]
            after = [
                line.strip()
                for line in lines[usage + 1 :]
                if line.strip() and not line[0].isspace() and not line.rstrip().endswith(":")
            ]
            reason = (after or before or ["tritonserver refused its command line"])[-1]
            return re.sub(r"^\S*/tritonserver:", "tritonserver:", reason)
        crash = [line.strip() for line in lines if any(m in line for m in CRASH_MARKERS)]
        if crash:
            return " ".join(crash[-2:])
        for pattern in (r"^E\d+", r"error", r"failed"):
            hits = [line for line in lines if re.search(pattern, line, re.IGNORECASE)]
            if hits:
                return hits[-1].strip()
        return lines[-1].strip() if lines else "no output"

    def _note(self, line: str) -> None:
        """A line of our own in the server's log, between two of its runs."""
        with open(self.log_path, "a") as log:
            log.write(f"tritonscale: {line}\n")

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def shm_regions(self) -> list[Path]:
        """This server's shared-memory regions in /dev/shm; none should outlive a stop."""
        return sorted(SHARED_MEMORY.glob(f"{self.shm_prefix}*"))

    def stop(self) -> None:
        """SIGTERM, wait for Triton's own unload timeout, then kill the whole group."""
        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=self.exit_timeout_s + 10)
            except subprocess.TimeoutExpired:
                pass
            # Stubs are in the server's process group; none may outlive it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
            # A server that was killed (not stopped) leaves its stubs' regions in /dev/shm,
            # memory until the next boot. The prefix is this object's own and its process
            # group is gone: nothing maps them any more.
            for region in self.shm_regions():
                region.unlink(missing_ok=True)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir / "backends", ignore_errors=True)

    def __enter__(self) -> LocalTriton:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
