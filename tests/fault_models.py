"""A model repository for fault tests: the real pipeline models, with faults that a test can
switch on from outside while the server runs.

`fault_repository(into)` copies the pipeline models (pipeline_async, pipeline_sync,
pipeline_gateway and the three branches) from models/ and replaces two files by test-only
wrappers around the real ones:

- pipeline_async/1/model.py loads the real model.py and wraps each BLS request it makes: while
  the file `raise_<branch>` in the repository's root holds a count N > 0, the next N calls to
  that branch raise from async_exec() (or exec()) instead of being sent, as a shared-memory or
  IPC failure of python_backend would; and each CANCELLED response a pipeline makes is noted,
  one line with the model's name, in the file `cancelled` (a cancelled client sees nothing,
  and Triton's statistics count an error response as a success). Each BLS call sent to a
  branch is noted too, one line with the branch's name, in the file `sent` (Triton counts a
  call only once it is answered). pipeline_sync and pipeline_gateway load this file as
  "pipeline_async's steps", so all three pipelines get the fault.
- branch_rank/1/model.py loads the real one and, while the file `omit_relevance` exists,
  answers without its RELEVANCE output.

Nothing here is shipped: the models' own code is what runs, and what is tested.
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MODELS = REPO_ROOT / "models"
PIPELINE_MODELS = (
    "pipeline_async",
    "pipeline_sync",
    "pipeline_gateway",
    "branch_embed",
    "branch_classify",
    "branch_rank",
)

_PIPELINE_WRAPPER = '''"""TEST ONLY: the real pipeline_async, with BLS calls that raise on demand."""

import importlib.util
import os

REAL = {real!r}
FAULTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_spec = importlib.util.spec_from_file_location("real_pipeline_async", REAL)
real = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(real)


def take_fault(branch):
    """True (and one fault fewer) while raise_<branch> holds a count above 0."""
    path = os.path.join(FAULTS, f"raise_{{branch}}")
    try:
        with open(path) as handle:
            left = int(handle.read().strip() or 0)
    except (OSError, ValueError):
        return False
    if left <= 0:
        return False
    with open(path, "w") as handle:
        handle.write(str(left - 1))
    return True


class FaultyRequest:
    def __init__(self, request, branch):
        self.request = request
        self.branch = branch

    def async_exec(self, *args, **kwargs):
        if take_fault(self.branch):

            async def fail():
                raise RuntimeError(f"injected fault in the BLS call to {{self.branch}}")

            return fail()
        note_sent(self.branch)
        return self.request.async_exec(*args, **kwargs)

    def exec(self, *args, **kwargs):
        if take_fault(self.branch):
            raise RuntimeError(f"injected fault in the BLS call to {{self.branch}}")
        note_sent(self.branch)
        return self.request.exec(*args, **kwargs)


def note_sent(branch):
    with open(os.path.join(FAULTS, "sent"), "a") as handle:
        handle.write(branch + "\\n")


_real_branch_request = real.branch_request


def branch_request(branch, output, hidden, timeout_us):
    return FaultyRequest(_real_branch_request(branch, output, hidden, timeout_us), branch)


_real_cancelled_response = real.cancelled_response


def cancelled_response(model_name):
    """The real CANCELLED response, noted in the file `cancelled` for the test to read."""
    with open(os.path.join(FAULTS, "cancelled"), "a") as handle:
        handle.write(model_name + "\\n")
    return _real_cancelled_response(model_name)


real.branch_request = branch_request
real.cancelled_response = cancelled_response
globals().update({{k: v for k, v in vars(real).items() if not k.startswith("__")}})
globals().update(branch_request=branch_request, cancelled_response=cancelled_response)
'''

_BRANCH_RANK_WRAPPER = '''"""TEST ONLY: the real branch_rank, which leaves out RELEVANCE on demand."""

import importlib.util
import os

import triton_python_backend_utils as pb_utils

REAL = {real!r}
FAULTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_spec = importlib.util.spec_from_file_location("real_branch_rank", REAL)
real = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(real)


class TritonPythonModel(real.TritonPythonModel):
    def execute(self, requests):
        responses = super().execute(requests)
        if os.path.exists(os.path.join(FAULTS, "omit_relevance")):
            return [pb_utils.InferenceResponse(output_tensors=[]) for _ in responses]
        return responses
'''


def fault_repository(into: Path) -> Path:
    """A model repository with the pipeline models and the fault switches above."""
    into.mkdir(parents=True, exist_ok=True)
    for model in PIPELINE_MODELS:
        shutil.copytree(MODELS / model, into / model, ignore=shutil.ignore_patterns("__pycache__"))
    wrappers = {
        "pipeline_async": _PIPELINE_WRAPPER,
        "branch_rank": _BRANCH_RANK_WRAPPER,
    }
    for model, template in wrappers.items():
        real = MODELS / model / "1" / "model.py"
        (into / model / "1" / "model.py").write_text(template.format(real=str(real)))
    return into


def set_raise(repository: Path, branch: str, count: int) -> None:
    """The next `count` BLS calls to `branch` raise (from any pipeline of the repository)."""
    (repository / f"raise_{branch}").write_text(str(count))


def raises_left(repository: Path, branch: str) -> int:
    path = repository / f"raise_{branch}"
    return int(path.read_text() or 0) if path.exists() else 0


def set_omit_relevance(repository: Path, on: bool) -> None:
    path = repository / "omit_relevance"
    if on:
        path.write_text("on")
    else:
        path.unlink(missing_ok=True)


def calls_sent(repository: Path, branch: str) -> int:
    """How many BLS calls the pipelines have sent to `branch` since the repository was
    written (faulted calls aside: they are never sent)."""
    path = repository / "sent"
    return path.read_text().split().count(branch) if path.exists() else 0


def cancelled_responses(repository: Path, model: str) -> int:
    """How many CANCELLED responses `model` has made since the repository was written."""
    path = repository / "cancelled"
    return path.read_text().split().count(model) if path.exists() else 0
