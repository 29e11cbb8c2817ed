"""make gpu-check: the repository on KIND_GPU instances, Triton's GPU metrics, the operator's view.

    python loadtests/gpu_check.py                 # on a machine with an NVIDIA GPU
    python loadtests/gpu_check.py --seconds 60    # a longer load phase

It runs from a checkout and installs nothing (no network needed): the `tritonscale` package
is imported from operator/, and tritonserver is the one the nvidia-pytriton wheel (the
`server` extra) put in the Python that runs the script. That Python needs the packages the
operator and the benchmarks import (numpy, tritonclient, requests, prometheus-client); a
missing one is named in one line. Finding no GPU needs the standard library only.

What it does, in order, printing one line per check:

1. Finds the GPUs (`nvidia-smi -L`). Where there is none, it prints one line and exits with
   code 2: nothing was checked.
2. Copies models/ into a temporary folder with every KIND_CPU instance group turned into
   KIND_GPU (what the chart does in GPU mode), starts tritonserver on it and checks that the
   pipeline models report KIND_GPU in their live config.
3. Reads Triton's /metrics: nv_gpu_utilization, nv_gpu_memory_used_bytes and
   nv_gpu_memory_total_bytes must be there for every GPU.
4. Puts load on the repository (pipeline_async, closed loop) and, because this repository's
   models compute with numpy on the CPU (their accelerator time is emulated), also keeps the
   GPU busy with matrix products when PyTorch or CuPy is installed, the way a real model
   would. Utilization and memory must move (their highest value during the load above the
   value before it).
5. Reads the same metrics the way the operator does (ScrapeSource, the local driver's
   source): its snapshot must carry GPU signals (utilization 0..1, memory used / total).

Exit code 0: every check passed; 1: a check failed (the lines say which); 2: no GPU here.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
# Run as a script from a checkout: loadtests.bench and this checkout's tritonscale are
# importable, installed or not.
for folder in (REPO_ROOT / "operator", REPO_ROOT):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

GPU_METRICS = ("nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes")
PIPELINE_MODELS = ("pipeline_async", "branch_embed", "branch_classify", "branch_rank")
NO_GPU = 2
TOTAL_MEMORY_WAIT_S = 15.0  # for Triton's first reading of the GPUs


def find_gpus(nvidia_smi: str = "nvidia-smi") -> tuple[list[str], str]:
    """(one line per GPU, "") or ([], why there is none)."""
    if shutil.which(nvidia_smi) is None:
        return [], f"{nvidia_smi} not found"
    try:
        done = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return [], f"{nvidia_smi} -L failed ({error})"
    gpus = [line.strip() for line in done.stdout.splitlines() if line.startswith("GPU ")]
    if done.returncode != 0 or not gpus:
        reason = (done.stderr or done.stdout).strip().splitlines()[:1] or ["no GPU listed"]
        return [], f"{nvidia_smi} -L: {reason[0]}"
    return gpus, ""


def gpu_repository(source: Path, into: Path) -> Path:
    """A copy of the model repository whose instance groups are KIND_GPU (as the chart's GPU
    mode writes them)."""
    shutil.copytree(source, into, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for config in into.glob("*/config.pbtxt"):
        config.write_text(config.read_text().replace("KIND_CPU", "KIND_GPU"))
    return into


def gpu_values(metrics_text: str) -> dict[str, dict[str, float]]:
    """{metric: {gpu label: value}} for Triton's GPU gauges in a /metrics page."""
    values: dict[str, dict[str, float]] = {name: {} for name in GPU_METRICS}
    pattern = re.compile(r"^(nv_gpu_[a-z_]+)\{([^}]*)\} (\S+)$", re.MULTILINE)
    for name, labels, value in pattern.findall(metrics_text):
        if name in values:
            gpu = dict(re.findall(r'(\w+)="([^"]*)"', labels)).get("gpu_uuid", labels)
            values[name][gpu] = float(value)
    return values


def gpu_burner() -> Callable[[threading.Event], None] | None:
    """A function that keeps the GPU busy until its event is set, or None without a library."""
    try:
        import torch

        if torch.cuda.is_available():

            def burn_torch(stop: threading.Event) -> None:
                a = torch.randn(4096, 4096, device="cuda")
                while not stop.is_set():
                    for _ in range(20):
                        a = torch.tanh(a @ a)
                    torch.cuda.synchronize()

            return burn_torch
    except ImportError:
        pass
    try:
        import cupy

        def burn_cupy(stop: threading.Event) -> None:
            a = cupy.random.standard_normal((4096, 4096), dtype=cupy.float32)
            while not stop.is_set():
                for _ in range(20):
                    a = cupy.tanh(a @ a)
                cupy.cuda.Device().synchronize()

        return burn_cupy
    except ImportError:
        return None


class Checks:
    """One line per check; the exit code at the end."""

    def __init__(self) -> None:
        self.failed = 0

    def check(self, ok: bool, what: str, detail: str = "") -> bool:
        self.failed += not ok
        print(f"gpu-check: {'ok    ' if ok else 'FAILED'} {what}{f' ({detail})' if detail else ''}")
        return ok


def serve_and_check(checks: Checks, seconds: float) -> None:
    """Steps 2 to 5 of the module's list, on a tritonserver of its own."""
    from loadtests.bench import common
    from tritonscale.local.triton_server import LocalTriton
    from tritonscale.metrics.scrape import ScrapeSource
    from tritonscale.triton.actuator import Actuator
    from tritonscale.triton.client import TritonClient
    from tritonscale.triton.endpoints import Endpoint

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        repository = gpu_repository(REPO_ROOT / "models", Path(folder) / "models")
        with LocalTriton(
            repository, http_port=0, grpc_port=0, metrics_port=0, models=list(PIPELINE_MODELS)
        ) as triton:
            actuator = Actuator(triton.repository_key)
            endpoint = Endpoint("local", triton.http_url, triton.metrics_url)
            for model in PIPELINE_MODELS:
                config = asyncio.run(actuator.live_config(endpoint, model))
                kinds = {g["kind"] for g in config["instance_group"]}
                checks.check(kinds == {"KIND_GPU"}, f"{model} serves on KIND_GPU", str(kinds))

            def sample() -> dict[str, dict[str, float]]:
                with TritonClient(endpoint, timeout_s=10) as client:
                    return gpu_values(client.metrics_text())

            # Triton reads the GPUs every couple of seconds (DCGM): until its first reading the
            # gauges are there but 0, the total memory too. Wait for that reading, bounded.
            before = sample()
            first_reading = time.monotonic() + TOTAL_MEMORY_WAIT_S
            while not all(before["nv_gpu_memory_total_bytes"].values()) and (
                time.monotonic() < first_reading
            ):
                time.sleep(0.5)
                before = sample()
            for name in GPU_METRICS:
                checks.check(bool(before[name]), f"{name} is reported", f"{before[name]}")
            totals = before["nv_gpu_memory_total_bytes"].values()
            checks.check(
                bool(totals) and all(total > 0 for total in totals),
                f"Triton read the GPUs' total memory within {TOTAL_MEMORY_WAIT_S:g} s",
                f"{before['nv_gpu_memory_total_bytes']}",
            )

            source = ScrapeSource([triton.metrics_url])
            asyncio.run(source.snapshot(list(PIPELINE_MODELS)))
            samples: list[dict[str, dict[str, float]]] = []
            stop = threading.Event()
            burner = gpu_burner()
            workers = [
                threading.Thread(
                    target=lambda: common.measure(
                        triton.grpc_url,
                        "pipeline_async",
                        common.pipeline_inputs(8),
                        concurrency=16,
                        seconds=seconds,
                        warmup_s=0.5,
                    ),
                    daemon=True,
                )
            ]
            if burner is not None:
                workers.append(threading.Thread(target=burner, args=(stop,), daemon=True))
            print(
                f"gpu-check: {seconds:g} s of load on pipeline_async"
                + (" and matrix products on the GPU" if burner else " (no PyTorch or CuPy here)")
            )
            for worker in workers:
                worker.start()
            snapshot: Any = None
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                samples.append(sample())
                snapshot = asyncio.run(source.snapshot(list(PIPELINE_MODELS), window_s=seconds))
                time.sleep(1.0)
            stop.set()
            for worker in workers:
                worker.join(timeout=60)

            for name in ("nv_gpu_utilization", "nv_gpu_memory_used_bytes"):
                start = max(before[name].values(), default=0.0)
                highest = max((max(s[name].values(), default=0.0) for s in samples), default=0.0)
                checks.check(highest > start, f"{name} moved under load", f"{start} -> {highest}")

            gpu = getattr(snapshot, "gpu", None)
            if checks.check(gpu is not None, "the operator's source reads GPU signals", f"{gpu}"):
                checks.check(
                    0.0 <= gpu.utilization <= 1.0, "GPU utilization is a fraction", f"{gpu}"
                )
                checks.check(
                    gpu.memory_fraction is not None and 0.0 < gpu.memory_fraction <= 1.0,
                    "GPU memory used / total is a fraction",
                    f"{gpu}",
                )


def run(seconds: float, nvidia_smi: str) -> int:
    gpus, why_none = find_gpus(nvidia_smi)
    if not gpus:
        print(f"gpu-check: no NVIDIA GPU on this machine ({why_none}); nothing was checked")
        return NO_GPU

    # Imported only now: finding no GPU needs nothing outside the standard library.
    try:
        importlib.import_module("loadtests.bench.common")  # numpy, tritonclient, tritonscale
        importlib.import_module("tritonscale.metrics.scrape")  # requests, prometheus-client
        from tritonscale.local.triton_server import LocalTritonError, TritonInstall
    except ImportError as error:
        print(f"gpu-check: FAILED {sys.executable} lacks {error.name or error}; install it")
        return 1
    try:
        TritonInstall()
    except LocalTritonError as error:
        print(f"gpu-check: FAILED {error}")
        return 1

    checks = Checks()
    print(f"gpu-check: {len(gpus)} GPU(s): {'; '.join(gpus)}")
    try:
        serve_and_check(checks, seconds)
    except LocalTritonError as error:  # Triton would not serve the KIND_GPU repository
        checks.check(False, "tritonserver serves the repository on KIND_GPU", str(error))
    print(f"gpu-check: {'all checks passed' if not checks.failed else f'{checks.failed} failed'}")
    return 1 if checks.failed else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="Length of the load phase")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="The nvidia-smi to ask")
    args = parser.parse_args(argv)
    sys.exit(run(args.seconds, args.nvidia_smi))


if __name__ == "__main__":
    main()
