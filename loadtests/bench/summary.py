"""Markdown tables from the benchmarks' JSON results (reports/bench/*.json).

python -m loadtests.bench.summary              # every result found
python -m loadtests.bench.summary --dir DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from loadtests.bench import common


def _f(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def async_vs_sync(doc: dict) -> list[str]:
    s = doc["settings"]
    lines = [
        f"{s['concurrency']} requests in flight, {s['rows']} row each, {s['seconds']:g} s per "
        f"measurement. Requests/s async vs sync (ratio), p95 ms async / sync:",
        "",
        "| parents | instances of each branch | async rps | sync rps | ratio | p95 async | p95 sync |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in doc["grid"]:
        lines.append(
            f"| {p['parent_instances']} | {p['branch_instances']} | {_f(p['async']['throughput_rps'])} "
            f"| {_f(p['sync']['throughput_rps'])} | {_f(p['throughput_ratio'], 2)} "
            f"| {_f(p['async']['p95_ms'], 0)} | {_f(p['sync']['p95_ms'], 0)} |"
        )
    lines += ["", "Fewest instances (parent + 3 x branch) for a throughput:", ""]
    for row in doc["fewest_instances_for_target"]:
        a = row["async"] or {}
        s_ = row["sync"] or {}
        lines.append(
            f"- {row['target_rps']} rps: async {a.get('total_instances', 'not reached in the grid')}"
            f", sync {s_.get('total_instances', 'not reached in the grid')}"
        )
    lines += [
        "",
        "| decoupled BLS instances | async rps | sync rps | ratio | per unit of work |",
        "|---|---|---|---|---|",
    ]
    for row in doc["decoupled"]:
        if "error" in row:
            lines.append(f"| {row['instances']} | error: {row['error']} | | | |")
            continue
        lines.append(
            f"| {row['instances']} | {_f(row['async']['throughput_rps'])} | {_f(row['sync']['throughput_rps'])} "
            f"| {_f(row['throughput_ratio'], 2)} | {_f(row['work_ratio'], 2)} |"
        )
    return lines


def operator_vs_static(doc: dict) -> list[str]:
    best = doc["best_static"]
    op = doc["operator"]
    return [
        f"Budget {doc['settings']['budget']} instances over {', '.join(doc['models'])}; "
        f"{doc['settings']['concurrency']} requests in flight.",
        "",
        f"- best static: {best['instances']} at {_f(best['throughput_rps'])} rps (p95 {_f(best['p95_ms'], 0)} ms), "
        f"out of {len(doc['static_sweep'])} configurations",
        f"- tritonscale tune from 1 each: {_f(op['throughput_fraction_of_best_static'], 2)} of it "
        f"(mean of the last three windows), 90 % reached after {_f(op['time_to_90pct_of_best_static_s'])} s",
        f"- instances at the end of high load: {op['instances_at_end_of_high_load']} "
        f"(total {op['total_instances_at_end_of_high_load']}, most at any time {op['max_total_instances']}, "
        f"within budget: {op['within_budget']})",
        f"- after {_f(doc['settings']['low_seconds'], 0)} s of low load ({doc['settings']['low_concurrency']} in flight): "
        f"{op['instances_at_end_of_low_load']} (total {op['total_instances_at_end_of_low_load']})",
        f"- {op['decisions']} decisions, {op['scale_changes']} count changes applied",
    ]


def bls_hop(doc: dict) -> list[str]:
    lines = [
        "| in flight | add_sub p50 / p95 ms | bls_sync p50 / p95 ms | bls_async p50 / p95 ms | hop p50 sync / async ms |",
        "|---|---|---|---|---|",
    ]
    for r in doc["by_concurrency"]:
        lines.append(
            f"| {r['concurrency']} | {_f(r['add_sub']['p50_ms'], 2)} / {_f(r['add_sub']['p95_ms'], 2)} "
            f"| {_f(r['bls_sync']['p50_ms'], 2)} / {_f(r['bls_sync']['p95_ms'], 2)} "
            f"| {_f(r['bls_async']['p50_ms'], 2)} / {_f(r['bls_async']['p95_ms'], 2)} "
            f"| {_f(r['bls_sync_hop_p50_ms'], 2)} / {_f(r['bls_async_hop_p50_ms'], 2)} |"
        )
    return lines


def loadgen_headroom(doc: dict) -> list[str]:
    lines = [
        "| users / in flight | Locust rps | asyncio rps | Locust / asyncio | client CPU ms per request, Locust / asyncio |",
        "|---|---|---|---|---|",
    ]
    for r in doc["by_users"]:
        lines.append(
            f"| {r['users']} | {_f(r['locust']['throughput_rps'], 0)} | {_f(r['asyncio']['throughput_rps'], 0)} "
            f"| {_f(r['locust_over_asyncio'], 2)} | {_f(r['locust']['client_cpu_ms_per_request'], 2)} / "
            f"{_f(r['asyncio']['client_cpu_ms_per_request'], 2)} |"
        )
    return lines


def gateway(doc: dict) -> list[str]:
    s = doc["settings"]
    variants = list(doc["variants"])
    lines = [
        f"One instance of each model, {s['rows']} row per request, {s['seconds']:g} s per run"
        + (
            ", each variant run twice (A B C D D C B A) and averaged"
            if s["balanced_rounds"]
            else ""
        )
        + ". Requests/s (p95 ms); ratio to sync; fraction of the branch-time ceiling; server CPU"
        " ms per request:",
        "",
        "| in flight | ceiling rps | "
        + " | ".join(variants)
        + " | gateway / better of async and plain |",
        "|---|---|" + "---|" * len(variants) + "---|",
    ]
    for p in doc["by_in_flight"]:
        cells = []
        for v in variants:
            r = p["variants"][v]
            cells.append(
                f"{_f(r['throughput_rps'], 0)} ({_f(r['p95_ms'], 0)}); x{_f(r['ratio_to_sync'], 2)}; "
                f"{_f(r['fraction_of_ceiling'], 2)}; {_f(r['server_cpu_ms_per_request'], 2)}"
            )
        lines.append(
            f"| {p['in_flight']} | {_f(p['ceiling_rps'], 0)} | "
            + " | ".join(cells)
            + f" | {_f(p['gateway_over_best_other'], 2)} |"
        )
    if doc["branches_alone"]:
        lines += ["", "Each branch alone at its count (rows/s it can take):", ""]
        for b in doc["branches_alone"]:
            lines.append(
                f"- {b['branch']} ({b['instances']} instance): {_f(b['rows_per_s'], 0)} rows/s "
                f"with {b['in_flight']} x {b['rows_per_request']} rows in flight"
            )
    if doc["grid"]:
        lines += [
            "",
            f"Grid at {s['grid_in_flight']} in flight, requests/s:",
            "",
            "| pipeline instances | instances of each branch | " + " | ".join(variants) + " |",
            "|---|---|" + "---|" * len(variants),
        ]
        for p in doc["grid"]:
            lines.append(
                f"| {p['parent_instances']} | {p['branch_instances']} | "
                + " | ".join(_f(p["variants"][v]["throughput_rps"], 0) for v in variants)
                + " |"
            )
    if doc["preprocess_pool"]:
        lines += [
            "",
            "Pre-processing inline (preprocess_threads 0) vs a pool of 2, requests/s:",
            "",
            "| model | in flight | inline | pool | pool / inline |",
            "|---|---|---|---|---|",
        ]
        for row in doc["preprocess_pool"]:
            lines.append(
                f"| {row['model']} | {row['in_flight']} | {_f(row['inline']['throughput_rps'], 0)} "
                f"| {_f(row['pool']['throughput_rps'], 0)} | {_f(row['pool_over_inline'], 2)} |"
            )
    return lines


RENDERERS = {
    "gateway": gateway,
    "async_vs_sync": async_vs_sync,
    "operator_vs_static": operator_vs_static,
    "bls_hop": bls_hop,
    "loadgen_headroom": loadgen_headroom,
}


def summary(folder: Path) -> str:
    parts = []
    for name, render in RENDERERS.items():
        path = folder / f"{name}.json"
        if not path.is_file():
            continue
        doc = json.loads(path.read_text())
        parts += [
            f"### {name}",
            "",
            f"`{doc['command']}`, finished {doc['finished']}, load average at start "
            f"{doc['machine']['load_average_at_start']} on {doc['machine']['cpus']} CPUs.",
            "",
            *render(doc),
            "",
        ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args(argv)
    text = summary(args.dir)
    if not text:
        raise SystemExit(
            f"no benchmark results in {args.dir}: run python -m loadtests.bench.NAME first"
        )
    print(text)


if __name__ == "__main__":
    main()
