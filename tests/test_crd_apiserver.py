"""The generated CRD and many specs, judged by Kubernetes' own validation code, as an API server would.

tests/crdcheck is a small Go program on k8s.io/apiextensions-apiserver (Kubernetes 1.34): the
code a kube-apiserver runs when a CRD is created (structural schema, valid defaults, CEL rules
that compile within the cost budget) and when an object is created with strict field
validation (unknown fields, defaults, schema, list sets, CEL rules, evaluated by cel-go).
`AutoscalerSpec.from_dict` must refuse exactly the specs it refuses, bar the CRD's known gaps,
and say a broken rule's message alike. The first build fetches Go modules and takes minutes.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings

from tests import test_fuzz
from tests.test_crd import CRD_GAPS, CRD_PATH, EXAMPLES, an_object
from tests.test_spec import INVALID, minimal
from tests.tooling import require_tool
from tritonscale.core.spec import AutoscalerSpec, InvalidSpec

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "crdcheck"
BINARY = ROOT / ".tools" / "bin" / "crdcheck"
# A first build compiles apiextensions-apiserver and cel-go: 13.5 minutes measured on two busy
# cores with the modules already fetched; seconds afterwards.
BUILD_TIMEOUT_S = 1500
CHECK_TIMEOUT_S = 120
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 2 * CHECK_TIMEOUT_S)
RULE_ERROR = ': Invalid value: "object": '  # how the API server reports a broken CEL rule


@pytest.fixture(scope="module")
def crdcheck() -> Path:
    """tests/crdcheck, built into .tools/bin (Go's build cache makes a rebuild take seconds)."""
    go = require_tool("go")
    try:
        # The flags of the local control plane's build (hack.cluster), so that
        # the packages both compile at the same versions come from Go's build cache.
        done = subprocess.run(
            [go, "build", "-mod=mod", "-trimpath", "-tags=selinux,notest,grpcnotrace"]
            + ["-o", str(BINARY), "."],
            cwd=SOURCE,
            env={**os.environ, "CGO_ENABLED": "0", "GOWORK": "off"},
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"building tests/crdcheck did not finish in {BUILD_TIMEOUT_S} s", False)
    assert done.returncode == 0, f"building tests/crdcheck failed:\n{done.stderr[-3000:]}"
    return BINARY


def judge(binary: Path, crd: Path, specs: list[Any]) -> tuple[int, str, list[list[str]]]:
    """(exit status, the CRD's errors, each spec's errors) from crdcheck."""
    lines = "".join(json.dumps(an_object(spec), allow_nan=False) + "\n" for spec in specs)
    try:
        done = subprocess.run(
            [str(binary), str(crd)],
            input=lines,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"crdcheck on {len(specs)} objects did not finish in {CHECK_TIMEOUT_S} s", False
        )
    verdicts = [json.loads(line) for line in done.stdout.splitlines()]
    if done.returncode != 1:  # 1: the CRD was refused, and no object judged
        assert len(verdicts) == len(specs), f"crdcheck stopped early: {done.stderr[-2000:]}"
    return done.returncode, done.stderr, verdicts


def from_dict_error(spec: Any) -> str | None:
    try:
        AutoscalerSpec.from_dict(copy.deepcopy(spec))
    except InvalidSpec as error:
        return str(error)
    return None


def fuzzed_specs(count: int) -> list[Any]:
    """tests/test_fuzz.py's broken specs, the same ones every run; JSON can carry them all."""
    found: list[Any] = []

    @seed(test_fuzz.SEED)
    @settings(
        max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(test_fuzz.broken_specs())
    def collect(spec: Any) -> None:
        found.append(spec)

    collect()
    return [spec for spec in found if _json_can_carry(spec)]


def _json_can_carry(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_can_carry(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_json_can_carry(item) for item in value)
    return value is None or isinstance(value, (str, int, bool))


VALID = [
    minimal(),
    minimal(minInstances=8, maxInstances=8),
    minimal(behavior={"scaleUp": {"selectPolicy": "Disabled", "policies": []}}),
    minimal(selector={"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}),
    minimal(tolerance=0, targets={"queueComputeRatio": 0, "utilization": 1}),
    minimal(maxInstances=None),  # a null is pruned, then defaulted
    *(yaml.safe_load(path.read_text())["spec"] for path in EXAMPLES),
]


def test_the_api_server_would_create_the_crd(crdcheck: Path) -> None:
    status, errors, _ = judge(crdcheck, CRD_PATH, [])
    assert (status, errors) == (0, "")


def test_the_checker_refuses_a_message_that_turns_a_number_into_a_string(
    crdcheck: Path, tmp_path: Path
) -> None:
    # A counterfactual, and the trap itself: the API server cannot bound string(int)'s cost.
    crd = yaml.safe_load(CRD_PATH.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rule = next(r for r in spec["x-kubernetes-validations"] if "minInstances" in r["rule"])
    rule.pop("message")
    rule["messageExpression"] = "'minInstances is ' + string(self.minInstances)"
    (tmp_path / "crd.yaml").write_text(yaml.safe_dump(crd))
    status, errors, _ = judge(crdcheck, tmp_path / "crd.yaml", [])
    assert status == 1 and "estimated messageExpression cost exceeds budget" in errors


def test_the_api_server_accepts_the_valid_specs_and_the_examples(crdcheck: Path) -> None:
    _, _, verdicts = judge(crdcheck, CRD_PATH, VALID)
    assert [from_dict_error(spec) for spec in VALID] == [None] * len(VALID)
    assert verdicts == [[]] * len(VALID)


def test_the_api_server_refuses_what_from_dict_refuses(crdcheck: Path) -> None:
    cases = [(case.name, case.spec) for case in INVALID if _json_can_carry(case.spec)]
    cases += [(f"fuzzed spec {i}", spec) for i, spec in enumerate(fuzzed_specs(300))]
    _, _, verdicts = judge(crdcheck, CRD_PATH, [spec for _, spec in cases])
    differ = [
        f"{name}: from_dict: {from_dict_error(spec)}; API server: {errors}"
        for (name, spec), errors in zip(cases, verdicts, strict=True)
        if name not in CRD_GAPS and (from_dict_error(spec) is None) != (errors == [])
    ]
    assert differ == []
    gaps = [errors for (name, _), errors in zip(cases, verdicts, strict=True) if name in CRD_GAPS]
    assert gaps == [[]] * len(gaps), "the CRD catches a gap now: drop it from CRD_GAPS"


def test_a_broken_rule_says_the_same_at_the_api_server_and_in_from_dict(crdcheck: Path) -> None:
    cases = [case for case in INVALID if isinstance(case.spec, dict) and _json_can_carry(case.spec)]
    _, _, verdicts = judge(crdcheck, CRD_PATH, [case.spec for case in cases])
    compared = 0
    for case, errors in zip(cases, verdicts, strict=True):
        for error in errors:
            if RULE_ERROR in error:
                # from_dict may add the values of the fields the rule shows.
                assert case.message.startswith(error.replace(RULE_ERROR, ": ")), case.name
                compared += 1
    assert compared >= 6
