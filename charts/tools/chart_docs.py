"""Keep the chart's value documentation in one place: the `## @param` lines of values.yaml.

From them this writes the parameter tables of charts/tritonscale/README.md (between the
`<!-- params:start -->` and `<!-- params:end -->` markers) and the `description` of each
value in values.schema.json. It also checks that every value has a `@param` line, that
every `@param` names a real value, and that the schema knows every value.

    python charts/tools/chart_docs.py          # rewrite README table and schema descriptions
    python charts/tools/chart_docs.py --check  # exit 1 and say what is stale or missing
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "tritonscale"
START, END = "<!-- params:start -->", "<!-- params:end -->"
_PARAM = re.compile(r"^\s*## @param (\S+) (.+?)\s*$")
_SECTION = re.compile(r"^\s*## @section (.+?)\s*$")


@dataclass(frozen=True)
class Param:
    section: str
    path: str
    description: str


def parse_params(values_text: str) -> list[Param]:
    params, section = [], ""
    for line in values_text.splitlines():
        if match := _SECTION.match(line):
            section = match.group(1)
        elif match := _PARAM.match(line):
            params.append(Param(section, match.group(1), match.group(2)))
    return params


def _lookup(values: Any, path: str) -> tuple[bool, Any]:
    node = values
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _leaves(values: Any, prefix: str = "") -> list[str]:
    """Paths of every scalar, list and empty map: each must be documented."""
    if isinstance(values, dict) and values:
        paths = []
        for key, child in values.items():
            paths += _leaves(child, f"{prefix}.{key}" if prefix else key)
        return paths
    return [prefix]


def _schema_node(schema: dict, path: str) -> dict | None:
    node = schema
    for key in path.split("."):
        while "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[-1]]
        node = node.get("properties", {}).get(key)
        if node is None:
            return None
    return node


def problems(values_text: str, schema: dict) -> list[str]:
    """What is undocumented, documented but absent, or missing from the schema."""
    values = yaml.safe_load(values_text)
    params = parse_params(values_text)
    documented = {param.path for param in params}
    found = []
    for leaf in _leaves(values):
        parts = leaf.split(".")
        prefixes = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        if not prefixes & documented:
            found.append(f"values.yaml: {leaf} has no ## @param line")
    for param in params:
        if not _lookup(values, param.path)[0]:
            found.append(f"values.yaml: @param {param.path} names no value")
        if _schema_node(schema, param.path) is None:
            found.append(f"values.schema.json: no schema for {param.path}")
    return found


def _default(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return "`" + text.replace("|", "\\|") + "`"


def render_table(values_text: str) -> str:
    values = yaml.safe_load(values_text)
    lines, section = [], None
    for param in parse_params(values_text):
        if param.section != section:
            section = param.section
            lines += ["", f"### {section}", "", "| Name | Description | Default |", "|---|---|---|"]
        description = param.description.replace("|", "\\|")
        lines.append(
            f"| `{param.path}` | {description} | {_default(_lookup(values, param.path)[1])} |"
        )
    return "\n".join(lines[1:]) + "\n"


def with_table(readme: str, table: str) -> str:
    head, sep, rest = readme.partition(START)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"README.md lacks the {START} ... {END} markers")
    return f"{head}{START}\n{table}{END}{tail}"


def with_descriptions(schema: dict, params: list[Param]) -> dict:
    """Set each documented value's schema description (a $ref'd node gets it beside the $ref)."""
    for param in params:
        node = _schema_node(schema, param.path)
        if node is not None:
            node["description"] = param.description
    return schema


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report, change nothing")
    args = parser.parse_args(argv)
    values_text = (CHART / "values.yaml").read_text()
    schema_path, readme_path = CHART / "values.schema.json", CHART / "README.md"
    schema_text, readme = schema_path.read_text(), readme_path.read_text()
    schema = json.loads(schema_text)
    found = problems(values_text, schema)
    try:
        new_readme = with_table(readme, render_table(values_text))
    except ValueError as error:
        print(f"chart_docs: {error}", file=sys.stderr)
        return 1
    new_schema = json.dumps(with_descriptions(schema, parse_params(values_text)), indent=2) + "\n"
    if args.check:
        if new_readme != readme:
            found.append("README.md: the parameter table is stale")
        if new_schema != schema_text:
            found.append("values.schema.json: descriptions differ from the @param lines")
        for line in found:
            print(line)
        if found:
            print("run `make chart-docs`", file=sys.stderr)
        return 1 if found else 0
    readme_path.write_text(new_readme)
    schema_path.write_text(new_schema)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
