"""Triton's /metrics text, read for the few families a reader uses.

prometheus_client's parser is pure Python and costs about as much per line as the rest of a
read; Triton's /metrics has a line per (family, model, version) and many families the
operator never looks at (cache, memory, CPU, request and input durations...). So the lines
of the families asked for are picked out first (a string split per line) and only they are
parsed. The parser still does the parsing: label escapes, values and types are its business.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from prometheus_client.parser import text_string_to_metric_families

# A series: (metric name, its labels as a sorted tuple).
Series = tuple[str, tuple[tuple[str, str], ...]]


def label_matcher(label: str, value: str) -> str:
    """`label="value"` as the text format writes it (backslash, quote and newline escaped)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{label}="{escaped}"'


def _wanted_lines(text: str, names: Collection[str], containing: str | None) -> str:
    """The sample, TYPE and HELP lines of the families `names` (`_total` samples included),
    the samples only where `containing` is in the line."""
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            words = line.split(None, 3)
            if len(words) >= 3 and words[1] in ("TYPE", "HELP") and words[2] in names:
                kept.append(line)
            continue
        head = line.split("{", 1)[0].split(None, 1)
        name = head[0] if head else ""
        if name in names or (name.endswith("_total") and name[: -len("_total")] in names):
            if containing is None or containing in line:
                kept.append(line)
    return "\n".join(kept) + "\n"


def parse_metrics(
    text: str, names: Collection[str], containing: str | None = None
) -> dict[Series, float]:
    """The samples of the families `names` in a Prometheus text exposition, by series.

    `containing` (a `label_matcher`) keeps the samples whose line holds it, and perhaps a few
    more (a label whose value ends the same way): the caller still reads the labels.
    A counter's samples keep the family's name (the parser calls them `<family>_total`;
    Triton's counters have no suffix). ValueError when a kept line does not parse.
    """
    names = frozenset(names)
    values: dict[Series, float] = {}
    for family in text_string_to_metric_families(_wanted_lines(text, names, containing)):
        for sample in family.samples:
            name = sample.name
            if family.type == "counter" and name == f"{family.name}_total":
                name = family.name
            if name in names:
                values[(name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return values


# Triton's request counters, by model: what a BACKEND failure rate is read from.
REQUEST_FAILURE = "nv_inference_request_failure"
REQUEST_SUCCESS = "nv_inference_request_success"
REQUEST_COUNTERS = (REQUEST_FAILURE, REQUEST_SUCCESS)


def request_counters(samples: Mapping[Series, float], model: str) -> tuple[float, float]:
    """(BACKEND failures, successes) of `model` in parsed samples: their totals over versions."""
    failures = successes = 0.0
    for (name, labels), value in samples.items():
        by = dict(labels)
        if by.get("model") != model:
            continue
        if name == REQUEST_FAILURE and by.get("reason") == "BACKEND":
            failures += value
        elif name == REQUEST_SUCCESS:
            successes += value
    return failures, successes
