"""make gpu-check: where there is no GPU, one line and exit code 2; its pure parts work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadtests import gpu_check
from tests.tooling import require_local_triton

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "loadtests" / "gpu_check.py"


def run_script(
    *args: str, python: tuple[str, ...] = (sys.executable,)
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*python, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd="/"
    )


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "nvidia-smi"  # no such program: as on a machine without a driver
    done = run_script("--nvidia-smi", str(missing))
    assert done.returncode == 2, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines() == [
        f"gpu-check: no NVIDIA GPU on this machine ({missing} not found); nothing was checked"
    ]


def test_finding_no_gpu_needs_the_standard_library_only(tmp_path: Path) -> None:
    # -S: no site-packages at all, as in a bare Python on a machine with no pip.
    done = run_script("--nvidia-smi", str(tmp_path / "nvidia-smi"), python=(sys.executable, "-S"))
    assert done.returncode == 2, done.stderr
    assert done.stdout.startswith("gpu-check: no NVIDIA GPU on this machine")


def test_a_python_without_the_packages_names_the_one_missing(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: Test GPU (UUID: GPU-0)'\n")
    fake.chmod(0o755)
    done = run_script("--nvidia-smi", str(fake), python=(sys.executable, "-S"))
    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines() == [
        f"gpu-check: FAILED {sys.executable} lacks numpy; install it"
    ]


def test_an_nvidia_smi_that_lists_no_gpu_counts_as_none(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n")
    fake.chmod(0o755)
    gpus, why = gpu_check.find_gpus(str(fake))
    assert gpus == [] and why == f"{fake} -L: No devices were found"


@pytest.mark.unit
def test_the_gpu_repository_turns_every_instance_group_into_kind_gpu(tmp_path: Path) -> None:
    copy = gpu_check.gpu_repository(REPO_ROOT / "models", tmp_path / "models")
    configs = sorted(copy.glob("*/config.pbtxt"))
    assert len(configs) == len(list((REPO_ROOT / "models").glob("*/config.pbtxt")))
    for config in configs:
        text = config.read_text()
        if 'platform: "ensemble"' in text:  # Triton schedules an ensemble: no instances
            assert "instance_group" not in text, config
            continue
        assert "KIND_CPU" not in text and "kind: KIND_GPU" in text, config
    original = REPO_ROOT / "models" / "pipeline_async" / "1" / "model.py"
    assert (copy / "pipeline_async" / "1" / "model.py").read_text() == original.read_text()


@pytest.mark.unit
def test_gpu_values_reads_tritons_gpu_gauges_per_gpu() -> None:
    page = "\n".join(
        [
            "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)",
            'nv_gpu_utilization{gpu_uuid="GPU-a"} 0.25',
            'nv_gpu_utilization{gpu_uuid="GPU-b"} 0',
            'nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 1048576',
            'nv_gpu_memory_total_bytes{gpu_uuid="GPU-a"} 8.0e+09',
            'nv_inference_count{model="add_sub",version="1"} 4',
        ]
    )
    assert gpu_check.gpu_values(page) == {
        "nv_gpu_utilization": {"GPU-a": 0.25, "GPU-b": 0.0},
        "nv_gpu_memory_used_bytes": {"GPU-a": 1048576.0},
        "nv_gpu_memory_total_bytes": {"GPU-a": 8e9},
    }


def test_a_gpu_that_triton_cannot_use_fails_with_one_line(tmp_path: Path) -> None:
    # nvidia-smi lists a GPU, but Triton finds none: the repository's KIND_GPU groups fail.
    require_local_triton()
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: Test GPU (UUID: GPU-0)'\n")
    fake.chmod(0o755)
    done = run_script("--nvidia-smi", str(fake), "--seconds", "1")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "gpu-check: 1 GPU(s): GPU 0: Test GPU (UUID: GPU-0)"
    assert lines[1].startswith("gpu-check: FAILED tritonserver serves the repository on KIND_GPU")
    assert "KIND_GPU but no GPUs are available" in lines[1]
    assert lines[2:] == ["gpu-check: 1 failed"]
