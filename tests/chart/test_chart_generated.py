"""The chart's generated files match their sources: one make target fixes each."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.chart.helm import CHART, REPO_ROOT, load_tool
from tritonscale.core.spec import AutoscalerSpec


@pytest.mark.unit
def test_readme_table_and_schema_descriptions_follow_the_param_lines() -> None:
    chart_docs = load_tool("chart_docs")
    values_text = (CHART / "values.yaml").read_text()
    schema_text = (CHART / "values.schema.json").read_text()
    schema = json.loads(schema_text)
    assert chart_docs.problems(values_text, schema) == []
    readme = (CHART / "README.md").read_text()
    assert chart_docs.with_table(readme, chart_docs.render_table(values_text)) == readme, (
        "run `make chart-docs`"
    )
    regenerated = (
        json.dumps(
            chart_docs.with_descriptions(schema, chart_docs.parse_params(values_text)), indent=2
        )
        + "\n"
    )
    assert regenerated == schema_text, "run `make chart-docs`"


@pytest.mark.unit
def test_docs_check_finds_an_undocumented_value() -> None:
    chart_docs = load_tool("chart_docs")
    values_text = (CHART / "values.yaml").read_text() + "\nundocumented: 1\n"
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert chart_docs.problems(values_text, schema) == [
        "values.yaml: undocumented has no ## @param line",
    ]


@pytest.mark.unit
def test_what_the_autoscaler_spec_generates_is_current() -> None:
    # The CRD, values.yaml's autoscalers.defaults, their schema and the contract's table all
    # come from tritonscale.core.spec; an edit to one of them by hand shows up here.
    assert load_tool("crd").drift() == [], "run `make crd`"


@pytest.mark.unit
def test_the_spec_generator_notices_a_hand_edit_and_a_missing_marker() -> None:
    crd = load_tool("crd")
    spec = crd.spec_schema()
    values = (CHART / "values.yaml").read_text()
    edited = values.replace("    maxInstances: 8\n", "    maxInstances: 9\n", 1)
    assert edited != values
    assert crd.values_text(spec, edited) == values
    with pytest.raises(ValueError, match="markers"):
        crd.values_text(spec, values.replace(crd.VALUES_END, ""))


@pytest.mark.unit
def test_the_generated_defaults_are_what_the_models_fill_in() -> None:
    # A counterfactual to the generator's own walk: pydantic's defaults, read back from
    # the chart's values, give the same spec as a spec with no keys at all.
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["autoscalers"]["defaults"]
    bare = {"selector": {"matchLabels": {"app": "triton"}}, "model": "m"}
    assert AutoscalerSpec.from_dict({**bare, **defaults}) == AutoscalerSpec.from_dict(bare)
    assert set(defaults) == set(AutoscalerSpec.from_dict(bare).to_dict()) - {
        "selector",
        "model",
        "calls",
    }


@pytest.mark.unit
def test_schema_accepts_the_defaults_and_documents_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(values)
    assert schema["additionalProperties"] is False


def test_plain_manifests_are_the_chart_rendered_with_its_defaults(helm4: str) -> None:
    render_manifests = load_tool("render_manifests")
    committed = render_manifests.OUTPUT.read_text()
    assert render_manifests.render(Path(helm4)) == committed, "run `make manifests`"
    objects = [doc for doc in yaml.safe_load_all(committed) if doc]
    kinds = [obj["kind"] for obj in objects]
    assert "Secret" not in kinds  # the user creates it; the header says how
    assert "Pod" not in kinds  # no helm test pod
    crds = {obj["metadata"]["name"] for obj in objects if obj["kind"] == "CustomResourceDefinition"}
    assert crds == {
        path_crd["metadata"]["name"]
        for path_crd in (
            yaml.safe_load(p.read_text()) for p in sorted((CHART / "crds").glob("*.yaml"))
        )
    }
    assert "kubectl -n tritonscale create secret generic tritonscale-repository-key" in committed
    secret_refs = {
        env["valueFrom"]["secretKeyRef"]["name"]
        for obj in objects
        if obj["kind"] == "Deployment"
        for c in obj["spec"]["template"]["spec"]["containers"]
        for env in c.get("env", [])
        if env["name"] == "TRITONSCALE_REPOSITORY_KEY"
    }
    assert secret_refs == {"tritonscale-repository-key"}
    assert render_manifests.OUTPUT.is_relative_to(REPO_ROOT / "charts" / "manifests")


def test_the_secret_command_in_the_manifest_header_makes_the_secret_it_needs(
    tools: dict[str, str],
) -> None:
    """Run the header's `kubectl create secret` (client dry run: no cluster needed)."""

    header = [line[1:].strip() for line in load_tool("render_manifests").HEADER.splitlines()]
    commands = " ".join(header).replace("\\ ", " ")
    start = commands.index("kubectl -n")
    command = shlex.split(commands[start : commands.index("kubectl apply")])
    assert command[:5] == ["kubectl", "-n", "tritonscale", "create", "secret"]
    command = [tools["kubectl"], *command[1:], "--dry-run=client", "-o", "yaml"]
    command = [arg.replace("$(openssl rand -hex 32)", "0123abcd") for arg in command]
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "KUBECONFIG": os.devnull}
    )
    assert done.returncode == 0, done.stderr
    secret = yaml.safe_load(done.stdout)
    objects = [
        doc for doc in yaml.safe_load_all(load_tool("render_manifests").OUTPUT.read_text()) if doc
    ]
    refs = {
        (
            obj["metadata"]["namespace"],
            env["valueFrom"]["secretKeyRef"]["name"],
            env["valueFrom"]["secretKeyRef"]["key"],
        )
        for obj in objects
        if obj["kind"] == "Deployment"
        for c in obj["spec"]["template"]["spec"]["containers"]
        for env in c.get("env", [])
        if env["name"] == "TRITONSCALE_REPOSITORY_KEY"
    }
    assert refs == {(secret["metadata"]["namespace"], secret["metadata"]["name"], "repository-key")}
    assert list(secret["data"]) == ["repository-key"]
