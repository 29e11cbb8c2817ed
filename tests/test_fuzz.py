"""Bad input, generated: malformed requests to every model over HTTP and gRPC, and broken
autoscaler specs and policy files.

A seeded generator reads each model's live config and breaks one thing per request (a
dtype, a shape, an input missing or extra, an empty or oversized tensor, invalid UTF-8 in a
string, a decoupled model called without a stream). Each must get an error response
(never a hang, never a success); a correct request follows each one and must get the
right answer; at the end every model is still ready and no stub has been replaced.
tests/test_bad_input.py checks hand-picked cases and their exact messages; this one covers
the space. Spec and policy-file fuzzing complements tests/test_spec.py's table.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from tests.faults import stub_pids
from tests.model_clients import PROTOCOLS, connect, infer, make_inputs
from tritonscale.core.spec import AutoscalerSpec, InvalidSpec
from tritonscale.drivers.tune import TuneConfigError, parse_config
from tritonscale.local.triton_server import LocalTriton

SEED = 20261129
REQUEST_TIMEOUT_S = 30  # an answer slower than this counts as a hang

NUMPY = {
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_UINT32": np.uint32,
    "TYPE_STRING": np.object_,
}
WRONG_DTYPES = [np.float16, np.float64, np.int8, np.int32, np.int64, np.uint8, np.bool_, np.object_]
# What the error must say, per kind of damage (Triton's core, or the model itself).
EXPECTED = {
    "dtype": ("data-type",),
    "shape": ("unexpected shape", "batch-size must be"),
    "missing": ("expected", "missing"),
    # Triton 2.51 words an extra input as "expected 2 inputs but got 3 inputs ... missing
    # required input(s) ]": it does not name the extra one.
    "extra": ("unexpected inference input", "inputs but got"),
    # A batched model with several inputs (pipeline_score) is refused for rows that differ
    # between its inputs: "input 'LABEL_PROBS' batch size does not match other inputs".
    "empty": ("unexpected shape", "batch-size", "byte size mismatch", "batch size does not match"),
    "oversized": ("unexpected shape", "batch-size must be", "batch size does not match"),
    # bls_sync decodes MODEL_NAME with replacement characters and names the model it could
    # not run.
    "utf8": ("utf-8", "decode", "could not run model"),
    "decoupled": ("decoupled",),
}


@dataclass(frozen=True)
class Port:
    name: str
    dtype: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class ModelShape:
    name: str
    batched: bool
    max_batch: int
    decoupled: bool
    inputs: tuple[Port, ...]


def model_shapes(triton: LocalTriton) -> list[ModelShape]:
    base = f"http://{triton.http_url}"
    index = requests.post(
        f"{base}/v2/repository/index",
        json={"ready": True},
        headers=triton.repository_headers,
        timeout=10,
    ).json()
    shapes = []
    for row in sorted(index, key=lambda r: r["name"]):
        config = requests.get(f"{base}/v2/models/{row['name']}/config", timeout=10).json()
        ports = tuple(
            Port(i["name"], i["data_type"], tuple(int(d) for d in i["dims"]))
            for i in config["input"]
        )
        shapes.append(
            ModelShape(
                row["name"],
                config.get("max_batch_size", 0) > 0,
                config.get("max_batch_size", 0),
                bool(config.get("model_transaction_policy", {}).get("decoupled")),
                ports,
            )
        )
    return shapes


def valid_array(port: Port, shape: ModelShape, rng: np.random.Generator, rows: int = 1):
    dims = [rows] if shape.batched else []
    dims += [4 if d < 0 else d for d in port.dims]
    if port.dtype == "TYPE_STRING":
        return np.array([b"add_sub"] * int(np.prod(dims)), dtype=np.object_).reshape(dims)
    if port.dtype in ("TYPE_INT32", "TYPE_UINT32"):
        return rng.integers(0, 8, size=dims).astype(NUMPY[port.dtype])
    return rng.standard_normal(dims).astype(NUMPY[port.dtype])


def damaged(shape: ModelShape, kind: str, rng: np.random.Generator) -> dict[str, np.ndarray] | None:
    """A request for `shape` with one kind of damage; None where the kind does not apply."""
    arrays = {port.name: valid_array(port, shape, rng) for port in shape.inputs}
    target = shape.inputs[int(rng.integers(len(shape.inputs)))]
    array = arrays[target.name]
    if kind == "dtype":
        wrong = [d for d in WRONG_DTYPES if d != NUMPY[target.dtype]]
        dtype = wrong[int(rng.integers(len(wrong)))]
        if dtype is np.object_:
            arrays[target.name] = np.array([b"x"] * array.size, dtype=np.object_).reshape(
                array.shape
            )
        else:
            arrays[target.name] = array.astype(dtype)
    elif kind == "shape":
        last = array.shape[-1]
        width = int(rng.choice([w for w in (1, 2, 3, 5, 7, 63, 65) if w != last]))
        arrays[target.name] = np.resize(array, (*array.shape[:-1], width))
    elif kind == "missing":
        del arrays[target.name]
    elif kind == "extra":
        arrays["EXTRA_INPUT"] = rng.standard_normal(4).astype(np.float32)
    elif kind == "empty":
        arrays[target.name] = np.resize(array, (0, *array.shape[1:]))
    elif kind == "oversized":
        if shape.batched:
            arrays[target.name] = valid_array(target, shape, rng, rows=shape.max_batch + 1)
        else:
            arrays[target.name] = np.resize(array, (*array.shape[:-1], 1 << 18))
    elif kind == "utf8":
        strings = [p for p in shape.inputs if p.dtype == "TYPE_STRING"]
        if not strings:
            return None
        arrays[strings[0].name] = np.array([b"\xff\xfe\xfdadd_sub"], dtype=np.object_)
    elif kind == "decoupled":
        if not shape.decoupled:
            return None
    return arrays


def cases(shapes: list[ModelShape]) -> Iterator[tuple[ModelShape, str, dict[str, np.ndarray]]]:
    rng = np.random.default_rng(SEED)
    for shape in shapes:
        for kind in EXPECTED:
            arrays = damaged(shape, kind, rng)
            if arrays is not None:
                yield shape, kind, arrays


# Correct requests and their answers, interleaved with the damaged ones.
def _add_sub(model: str) -> Callable[[Any, str, np.random.Generator], None]:
    def check(client: Any, protocol: str, rng: np.random.Generator) -> None:
        a, b = (rng.standard_normal(4).astype(np.float32) for _ in range(2))
        arrays = {"INPUT0": a, "INPUT1": b}
        if model == "bls_sync":
            arrays["MODEL_NAME"] = np.array([b"add_sub"], dtype=np.object_)
        out = infer(client, protocol, model, arrays, ["OUTPUT0", "OUTPUT1"])
        np.testing.assert_allclose(out["OUTPUT0"], a + b, rtol=1e-6)
        np.testing.assert_allclose(out["OUTPUT1"], a - b, rtol=1e-6)

    return check


def _squares(model: str, factor: int) -> Callable[[Any, str, np.random.Generator], None]:
    def check(client: Any, protocol: str, rng: np.random.Generator) -> None:
        value = int(rng.integers(1, 6))
        out = infer(client, protocol, model, {"IN": np.array([value], dtype=np.int32)}, ["SUM"])
        assert out["SUM"].tolist() == [factor * value * value]

    return check


def _pipeline(model: str) -> Callable[[Any, str, np.random.Generator], None]:
    def check(client: Any, protocol: str, rng: np.random.Generator) -> None:
        rows = int(rng.integers(1, 4))
        features = rng.standard_normal((rows, 64)).astype(np.float32)
        out = infer(client, protocol, model, {"FEATURES": features}, ["LABEL_PROBS", "SCORE"])
        np.testing.assert_allclose(out["LABEL_PROBS"].sum(axis=1), 1.0, rtol=1e-4)
        assert out["SCORE"].shape == (rows, 1) and np.all((out["SCORE"] > 0) & (out["SCORE"] < 1))

    return check


def _chain(model: str) -> Callable[[Any, str, np.random.Generator], None]:
    def check(client: Any, protocol: str, rng: np.random.Generator) -> None:
        rows = int(rng.integers(1, 4))
        features = rng.standard_normal((rows, 64)).astype(np.float32)
        out = infer(client, protocol, model, {"FEATURES": features}, ["LABEL_PROBS"])
        np.testing.assert_allclose(out["LABEL_PROBS"].sum(axis=1), 1.0, rtol=1e-4)

    return check


def _fanout(model: str) -> Callable[[Any, str, np.random.Generator], None]:
    def check(client: Any, protocol: str, rng: np.random.Generator) -> None:
        rows = int(rng.integers(1, 4))
        features = rng.standard_normal((rows, 64)).astype(np.float32)
        out = infer(client, protocol, model, {"FEATURES": features}, ["ITEM_COUNT", "ITEM_PROBS"])
        count = int(out["ITEM_COUNT"][0, 0])
        assert 1 <= count <= 4
        np.testing.assert_allclose(out["ITEM_PROBS"][:, :count].sum(axis=2), 1.0, rtol=1e-4)

    return check


GOOD = [
    _add_sub("add_sub"),
    _add_sub("pytorch"),
    _add_sub("bls_sync"),
    _add_sub("bls_async"),
    _squares("bls_decoupled_sync", 1),
    _squares("bls_decoupled_async", 2),
    _pipeline("pipeline_async"),
    _pipeline("pipeline_sync"),
    _pipeline("pipeline_ensemble"),
    _chain("chain_async"),
    _fanout("fanout_async"),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_damaged_request_gets_an_error_and_nothing_breaks(triton, protocol) -> None:
    shapes = model_shapes(triton)
    assert {s.name for s in shapes} >= {"add_sub", "bls_sync", "square_int32", "pipeline_async"}
    stubs_before = {s.name: stub_pids(triton, s.name) for s in shapes}
    rng = np.random.default_rng(SEED + 1)
    wrong_successes, unclear, sent = [], [], 0
    with connect(triton, protocol) as client:
        for number, (shape, kind, arrays) in enumerate(cases(shapes)):
            sent += 1
            try:
                client.infer(
                    shape.name,
                    make_inputs(protocol, arrays),
                    **(
                        {"client_timeout": REQUEST_TIMEOUT_S}
                        if protocol == "grpc"
                        else {"timeout": REQUEST_TIMEOUT_S * 1_000_000}
                    ),
                )
            except InferenceServerException as error:
                message = error.message() or ""
                assert "Deadline Exceeded" not in message and "timed out" not in message, (
                    f"{shape.name} {kind}: no answer in {REQUEST_TIMEOUT_S} s"
                )
                # Over HTTP a decoupled model refuses every request, whatever is wrong with it.
                words = EXPECTED["decoupled"] if shape.decoupled else EXPECTED[kind]
                if not any(word.lower() in message.lower() for word in words):
                    unclear.append(f"{shape.name} {kind}: {message}")
            else:
                wrong_successes.append(f"{shape.name} {kind}")
            GOOD[number % len(GOOD)](client, protocol, rng)  # must answer right, at once

        assert wrong_successes == []
        assert unclear == [], "\n".join(unclear)
        assert sent >= 4 * len(shapes)
        for shape in shapes:
            assert client.is_model_ready(shape.name), shape.name
    # No stub died and was replaced: the same processes serve.
    assert {s.name: stub_pids(triton, s.name) for s in shapes} == stubs_before


# ---- specs and policy files ------------------------------------------------------------------

VALID_SPEC: dict[str, Any] = {
    "selector": {"matchLabels": {"app.kubernetes.io/component": "triton"}},
    "model": "pipeline_async",
    "calls": ["branch_embed", "branch_rank"],
    "minInstances": 1,
    "maxInstances": 4,
    "targets": {"utilization": 0.7, "queueComputeRatio": 0.5, "pendingPerInstance": 2.0},
    "tolerance": 0.1,
    "behavior": {
        "scaleUp": {"policies": [{"type": "Instances", "value": 2, "periodSeconds": 15}]},
        "scaleDown": {"stabilizationWindowSeconds": 60},
    },
    "metricsWindowSeconds": 30,
    "intervalSeconds": 10,
}

ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path in a nested dict/list."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


SPEC_PATHS = _paths(VALID_SPEC)


def _set(tree: Any, path: tuple, value: Any, delete: bool) -> Any:
    tree = copy.deepcopy(tree)
    node = tree
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return tree


@st.composite
def broken_specs(draw: st.DrawFn) -> dict[str, Any]:
    """The valid spec with one to three values replaced by odd ones, deleted, or an unknown key."""
    spec = copy.deepcopy(VALID_SPEC)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(spec)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "delete", "unknown"]))
        if action == "unknown":
            parent = spec
            for key in path[:-1]:
                parent = parent[key]
            if isinstance(parent, dict):
                parent[draw(st.sampled_from(["minInstance", "extra", "maxinstances"]))] = 1
        else:
            spec = _set(spec, path, draw(ODD_VALUES), action == "delete")
    return spec


@seed(SEED)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(broken_specs())
def test_a_broken_spec_is_accepted_or_refused_in_one_line_naming_the_field(spec) -> None:
    try:
        parsed = AutoscalerSpec.from_dict(spec)
    except InvalidSpec as error:
        message = str(error)
        assert message.startswith("spec"), message
        assert "\n" not in message and len(message) < 400, message
        assert "Traceback" not in message
    else:
        # Whatever got through is a spec the policy can run with.
        assert 1 <= parsed.min_instances <= parsed.max_instances
        assert parsed.model and parsed.model not in parsed.calls


VALID_FILE: dict[str, Any] = {
    "triton": {"http": ["127.0.0.1:8000"], "metrics": ["http://127.0.0.1:8002/metrics"]},
    "metrics": {"source": "scrape"},
    "policies": [
        {"name": "pipeline", "spec": {k: v for k, v in VALID_SPEC.items() if k != "selector"}}
    ],
}


@st.composite
def broken_files(draw: st.DrawFn) -> Any:
    if draw(st.booleans()):
        return draw(ODD_VALUES)  # not even a mapping
    tree = copy.deepcopy(VALID_FILE)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(tree) or [("triton",)]))
        tree = _set(tree, path, draw(ODD_VALUES), draw(st.booleans()))
        if not isinstance(tree, dict):
            break
    return tree


@seed(SEED)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(broken_files())
def test_a_broken_policy_file_is_refused_in_one_line_naming_the_file(data) -> None:
    try:
        parse_config(data, path="policies.yaml")
    except TuneConfigError as error:
        message = str(error)
        assert message.startswith("policies.yaml: "), message
        assert "\n" not in message and len(message) < 400, message
