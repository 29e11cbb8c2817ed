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
    settings = doc["settings"]
    within = "yes" if doc["reached_95pct_within_60s"] else "no"
    return [
        f"Budget {doc['budget']} instances over {', '.join(doc['models'])}; "
        f"{settings['concurrency']} requests of {settings['rows']} rows in flight.",
        "",
        f"- best static: {best['instances']} at {_f(doc['best_static_rps'])} rps "
        f"(p95 {_f(best['p95_ms'], 0)} ms), out of {len(doc['static_sweep'])} configurations",
        f"- tritonscale tune from 1 each: {_f(doc['operator_rps'])} rps (mean of the last three "
        f"windows), {_f(op['throughput_fraction_of_best_static'], 2)} of it; 95 % reached "
        f"{_f(doc['seconds_to_95pct'])} s after the load step (within 60 s: {within})",
        f"- instances at the end of high load: {op['instances_at_end_of_high_load']} "
        f"(total {op['total_instances_at_end_of_high_load']}, most at any time "
        f"{doc['max_total_instances']}, within the budget: {doc['within_budget']})",
        f"- the budget: {doc['budget_note']}",
        f"- after {_f(settings['low_seconds'], 0)} s of low load ({settings['low_concurrency']} "
        f"in flight): {op['instances_at_end_of_low_load']} "
        f"(total {op['total_instances_at_end_of_low_load']})",
        f"- {op['decisions']} decisions, {op['scale_changes']} count changes applied",
    ]


def shifted_mix(doc: dict) -> list[str]:
    settings, op = doc["settings"], doc["operator"]
    first, second = doc["halves"]
    vs_best, vs_kept = doc["operator_vs_best_static"], doc["operator_vs_first_half_best_kept"]
    lines = [
        f"Budget {doc['budget']} instances over {', '.join(doc['models'])}; "
        f"{settings['concurrency']} requests of {settings['rows']} rows in flight on {first}, "
        f"then on {second} ({settings['half_seconds']:g} s each).",
        "",
        f"| configuration | instances | {first} rps | {second} rps |",
        "|---|---|---|---|",
    ]
    for key, label in (
        ("best_static_first_half", f"best static for {first}"),
        ("best_static_second_half", f"best static for {second}"),
        ("best_static_over_both", "best static over both halves"),
    ):
        row = doc[key]
        lines.append(
            f"| {label} | {row['instances']} | {_f(row['first_rps'])} | {_f(row['second_rps'])} |"
        )
    lines += [
        f"| tritonscale tune from 1 each | most {op['max_total_instances']} at once; at the ends "
        f"{op['instances_at_end_of_first_half']}, {op['instances_at_end_of_second_half']} "
        f"| {_f(op['first_rps'])} | {_f(op['second_rps'])} |",
        "",
        f"- one configuration best for both halves: {'yes' if doc['one_configuration_best_for_both'] else 'no'}",
        f"- operator / best static of each half: {_f(vs_best['first_half'], 2)} and "
        f"{_f(vs_best['second_half'], 2)}; in the second half / the first half's best kept: "
        f"{_f(vs_kept['second_half'], 2)}",
        f"- 95 % of the second half's best reached {_f(doc['seconds_after_shift_to_95pct_of_second_best'])} s "
        f"after the shift",
        f"- the budget: {doc['budget_note']}",
    ]
    return lines


def scale_down(doc: dict) -> list[str]:
    spec = doc["policies"][0]
    down = spec["behavior"]["scaleDown"]
    steps = ", ".join(
        f"{p['value']} {p['type'].lower()} per {p['periodSeconds']} s" for p in down["policies"]
    )
    # Older results hold only each model's first scale-down.
    after_drop = doc.get("scale_downs_after_drop_s") or {
        m: [s] for m, s in doc["first_scale_down_after_drop_s"].items()
    }
    downs = "; ".join(
        f"{m} {', '.join(f'{s:g}' for s in times)} s" for m, times in sorted(after_drop.items())
    )
    return [
        f"Windows: ticks every {spec['intervalSeconds']} s, rates over {spec['metricsWindowSeconds']} s, "
        f"scale-down window {down['stabilizationWindowSeconds']} s, at most {steps}.",
        "",
        f"- at the drop: {doc['instances_at_drop']} (total {doc['total_at_drop']}, floor {doc['floor']})",
        f"- back at the floor {_f(doc['seconds_to_floor'])} s after the load dropped (the windows "
        f"allow {_f(doc['earliest_possible_s'], 0)} s at the earliest, "
        f"{_f(doc.get('allowed_s'), 0)} s at the latest)",
        f"- scale-downs after the drop: {downs or 'none'}",
    ]


def steady(doc: dict) -> list[str]:
    counts = ", ".join(f"{m} {n}" for m, n in doc["instances_end"].items())
    flaps = ", ".join(f"{m} {n}" for m, n in doc["reversals"].items())
    return [
        f"{_f(doc['offered_rps'], 0)} req/s offered for {doc['seconds'] / 60:g} min "
        f"({doc['load_multiple']:g} x the capacity at one instance each, {_f(doc['capacity_rps'], 0)} "
        f"req/s), the demo's windows, metrics from {doc['metrics']}.",
        "",
        f"- served {_f(doc['served_rps'], 0)} req/s, {doc['failed_or_dropped']} failed or dropped; "
        f"p95 {_f(doc['p95_ms_last_10s'], 0)} ms at the end (objective {_f(doc['p95_objective_ms'], 0)} ms, "
        f"under it and kept there after {_f(doc['seconds_to_objective'], 0)} s)",
        f"- {len(doc['changes'])} changes, {doc['changes_after_reaction']} after the first "
        f"{doc['reaction_s']:g} s; reversals: {flaps}; given back once (StepFellShort): "
        + (", ".join(f"{m} {n}" for m, n in doc.get("given_back", {}).items()) or "-"),
        f"- instances at the end: {counts}",
    ]


def control_loop_scale(doc: dict) -> list[str]:
    lines = [
        f"Pods serve {', '.join(doc['models'])} ({_f(doc['pod_memory_mb'], 0)} MB each); four "
        f"autoscalers per pod set, one tune loop per set; ticks every {doc['settings']['interval_s']} s.",
        "",
        "| pods | sets | autoscalers | steady tick ms, median / p95 | round of a set ms | longest without a decision, s | tick loading every pod of a set, ms | one load ms | one pod hung: its set's tick ms | its set's longest without a decision, s | its other pods changed after, s | other sets' longest without a decision, s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["layouts"]:
        hung = r.get("hung") or {}
        own = hung.get("own_set") or {}
        others = hung.get("other_sets") or {}
        lines.append(
            f"| {r['pods']} | {r['sets']} | {r['autoscalers']} "
            f"| {_f(r['steady']['tick_ms']['median'], 0)} / {_f(r['steady']['tick_ms']['p95'], 0)} "
            f"| {_f(r['steady']['round_ms']['median'], 0)} "
            f"| {_f(r['steady']['longest_without_decision_s'])} "
            f"| {_f(r['change']['loading_tick_ms']['median'], 0)} "
            f"| {_f(r['change']['load_per_pod_ms']['median'], 0)} "
            f"| {_f((own.get('tick_ms') or {}).get('median'), 0)} "
            f"| {_f(own.get('longest_without_decision_s'))} "
            f"| {_f(own.get('other_pods_changed_after_s'))} "
            f"| {_f(others.get('longest_without_decision_s'))} |"
        )
    return lines


def fleet(doc: dict) -> list[str]:
    lines = [
        f"{doc['pods_per_set']} pods per Deployment, one autoscaler per (Deployment, model), five "
        f"models; the step gives a tenth of the sets {_f(doc['step_factor'], 0)} times the load. "
        "Requests are per interval; the API server's are the operator's own (audit log), then "
        "every client's.",
        "",
        "| pods | autoscalers | source | interval s | tick lateness p99 / max, s | mean tick s | operator cores | operator RSS MiB | API requests (all clients) | Triton requests | step applied, s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        step = r["step"]
        applied = _f(r["seconds_to_apply_step"])
        if r["seconds_to_apply_step"] is None:
            applied = f"not within {_f(step['timeout_s'], 0)} ({step['risen']} of {step['pod_models']} rose)"
        lines.append(
            f"| {r['pods']} | {r['autoscalers']} | {r['source']} | {r['interval_s']} "
            f"| {_f(r['p99_tick_lateness_s'], 2)} / {_f(r['max_tick_lateness_s'], 2)} "
            f"| {_f(r.get('mean_tick_s'), 2)} | {_f(r['operator_cpu_cores'], 2)} | {_f(r['operator_rss_mib'], 0)} "
            f"| {_f(r['apiserver_requests_per_interval'])} "
            f"({_f(r['apiserver_requests_per_interval_all_clients'])}) "
            f"| {_f(r['triton_requests_per_interval'])} | {applied} |"
        )
    return lines


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
        f"One instance of each model, {s['rows']} row per request, {s['seconds']:g} s per run."
    ]
    if doc["by_in_flight"]:
        lines += [
            "",
            "Every variant over one shared gRPC stream"
            + (", each run twice (A B C D D C B A) and averaged" if s["balanced_rounds"] else "")
            + ". Requests/s (p95 ms); ratio to sync; fraction of the branch-time ceiling; "
            "server CPU ms per request:",
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
    if doc.get("users_paths"):
        pairs = [
            (v, path) for v, paths in doc["users_paths"][0]["variants"].items() for path in paths
        ]
        lines += [
            "",
            "Each variant on its users' paths (unary gRPC and HTTP; a gRPC stream per user for "
            "the decoupled gateways). Requests/s (p95 ms); server CPU ms per request; then the "
            "gateway over pipeline_async on each path, for the means and (per round):",
            "",
            "| in flight | "
            + " | ".join(f"{v} ({path})" for v, path in pairs)
            + " | gateway / async gRPC | gateway / async HTTP |",
            "|---|" + "---|" * (len(pairs) + 2),
        ]
        for p in doc["users_paths"]:
            cells = []
            for v, path in pairs:
                r = p["variants"][v][path]
                cells.append(
                    f"{_f(r['throughput_rps'], 0)} ({_f(r['p95_ms'], 0)}); "
                    f"{_f(r['server_cpu_ms_per_request'], 2)}"
                )
            ratios = [
                f"{_f(p['gateway_over_async'][path], 2)} ("
                + ", ".join(_f(r, 2) for r in p["gateway_over_async_by_round"][path])
                + ")"
                for path in ("grpc", "http")
            ]
            lines.append(f"| {p['in_flight']} | " + " | ".join(cells + ratios) + " |")
    if doc.get("gateway_paths"):
        variants_paths = doc["gateway_paths"][0]["variants"]
        pairs = [(v, path) for v, paths in variants_paths.items() for path in paths]
        ratio_pairs = [
            (mine, theirs)
            for mine in variants_paths["gateway"]
            for theirs in variants_paths["async"]
        ]
        lines += [
            "",
            "The gateway on each client path beside pipeline_async on each (shared_stream: "
            "every request on one gRPC stream; stream: a stream per user). Requests/s (p95 ms); "
            "rows per branch call; then the gateway over pipeline_async for each pair of paths, "
            "for the means and (per round):",
            "",
            "| in flight | "
            + " | ".join(f"{v} ({path})" for v, path in pairs)
            + " | "
            + " | ".join(f"gateway {mine} / async {theirs}" for mine, theirs in ratio_pairs)
            + " |",
            "|---|" + "---|" * (len(pairs) + len(ratio_pairs)),
        ]
        for p in doc["gateway_paths"]:
            cells = [
                f"{_f(p['variants'][v][path]['throughput_rps'], 0)} "
                f"({_f(p['variants'][v][path]['p95_ms'], 0)}); "
                f"{_f(p['variants'][v][path]['rows_per_branch_call'], 2)}"
                for v, path in pairs
            ]
            ratios = [
                f"{_f(p['gateway_over_async'][mine][theirs], 2)} ("
                + ", ".join(_f(r, 2) for r in p["gateway_over_async_by_round"][mine][theirs])
                + ")"
                for mine, theirs in ratio_pairs
            ]
            lines.append(f"| {p['in_flight']} | " + " | ".join(cells + ratios) + " |")
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


def vegeta(doc: dict) -> list[str]:
    s = doc["settings"]
    lines = [
        f"vegeta {doc['vegeta_version']} against the project's generators, one after the other at "
        f"each rate for {s['seconds']:g} s on one server; capacity: the project's closed loop, "
        f"{s['capacity_in_flight']} in flight over gRPC. Rates in requests/s, latencies in ms; "
        f"ratios are to vegeta's (served, p50, p95, p99), those more than "
        f"{doc['tolerance']:.0%} from 1 in bold.",
        "",
        "| model | rate (x capacity) | generator | offered | served | p50 | p95 | p99 | ratios to vegeta |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model in doc["by_model"]:
        for point in model["points"]:
            where = (
                f"{model['model']} | {point['rate_rps']} ({point['fraction_of_capacity']:g} x "
                f"{_f(model['capacity_rps'], 0)})"
            )
            for name, run in point["generators"].items():
                ratios = point["ratios"].get(name)
                cells = "-"
                if ratios:
                    cells = " / ".join(
                        f"**{_f(v, 2)}**"
                        if v is not None and abs(v - 1) > doc["tolerance"]
                        else _f(v, 2)
                        for v in ratios.values()
                    )
                lines.append(
                    f"| {where} | {name} | {_f(run['offered_rps'], 0)} | {_f(run['served_rps'], 0)} "
                    f"| {_f(run['p50_ms'])} | {_f(run['p95_ms'])} | {_f(run['p99_ms'])} | {cells} |"
                )
    failed = [
        f"{m['model']} at {p['rate_rps']}: {name} {run['failures']}"
        for m in doc["by_model"]
        for p in m["points"]
        for name, run in p["generators"].items()
        if run["failures"]
    ]
    lines += ["", f"- failed requests: {', '.join(failed) or 'none'}"]
    lines.append(f"- ratios more than {doc['tolerance']:.0%} from 1: {len(doc['flags'])}")
    return lines


def count_changes(doc: dict) -> list[str]:
    lines = [
        f"Every model of pipeline_async 1 -> 2 -> 3 -> 2 -> 1 under loads that never drain; "
        f"a change counts when Triton's config shows it within {_f(doc['goal_s'], 0)} s.",
        "",
        "| --rate-limit | load | within the goal | stalled | median s | slowest s |",
        "|---|---|---|---|---|---|",
    ]
    for arm, loads in doc["arms"].items():
        for load in ("closed_loop", "open_loop"):
            row = loads[load]
            lines.append(
                f"| {arm} | {load.replace('_', ' ')} | {row['within_goal']} of "
                f"{row['changes_total']} | {row['stalled']} | {_f(row['median_seconds'], 2)} | "
                f"{_f(row['max_seconds'], 2)} |"
            )
    lines += [
        "",
        "| instances | execution_count rps | off rps | ratio | p95 ratio |",
        "|---|---|---|---|---|",
    ]
    for row in doc["cost"]:
        lines.append(
            f"| {'/'.join(str(c) for c in row['instances'].values())} | "
            f"{_f(row['execution_count']['throughput_rps'])} | {_f(row['off']['throughput_rps'])} | "
            f"{_f(row['throughput_ratio'], 3)} | {_f(row['p95_ratio'], 3)} |"
        )
    return lines


def model_accuracy(doc: dict) -> list[str]:
    lines = [
        "The performance model (tritonscale.core.lqn) built from the starting split's windows "
        f"({doc['settings']['concurrency']} requests of {doc['settings']['rows']} rows in "
        "flight), against every split measured under the same running load:",
        "",
        "| root | splits | throughput within 10 % | mean abs error | p95 within 25 % | "
        "mean abs error |",
        "|---|---|---|---|---|---|",
    ]
    for pipeline in doc["pipelines"]:
        lines.append(
            f"| {pipeline['root']} | {len(pipeline['splits'])} | "
            f"{_f(pipeline['throughput_within_10pct_share'], 2)} | "
            f"{_f(pipeline['throughput_mean_abs_error'], 3)} | "
            f"{_f(pipeline['p95_within_25pct_share'], 2)} | "
            f"{_f(pipeline['p95_mean_abs_error'], 3)} |"
        )
    return lines


def trace(doc: dict) -> list[str]:
    objective = doc["objective"]
    lines = [
        f"{doc['root']} on a {round(doc['trace']['seconds'] / 60, 1):g}-minute day, "
        f"{_f(doc['trace']['trough_rps'], 0)} to {_f(doc['peak_rps'], 0)} req/s (0.8 of the best "
        f"split of {doc['budget']} instances, {_f(doc['largest_split_rps'], 0)} req/s), "
        f"{len(doc['trace']['bursts'])} bursts; objective p{round(100 * objective['quantile'])} "
        f"<= {objective['milliseconds']:g} ms.",
        "",
        "| arm | runs | 10 s windows met | requests met | instance-seconds | good requests per instance-second |",
        "|---|---|---|---|---|---|",
    ]
    for arm, row in doc["arms"].items():
        runs = len(row.get("runs", [])) or "computed"
        lines.append(
            f"| {arm} | {runs} | {_f(row['windows_met_share'], 3)} | {_f(row['requests_met_share'], 3)} "
            f"| {_f(row['instance_seconds'], 0)} | {_f(row['goodput_per_instance_second'], 2)} |"
        )
    return lines


RENDERERS = {
    "count_changes": count_changes,
    "gateway": gateway,
    "async_vs_sync": async_vs_sync,
    "operator_vs_static": operator_vs_static,
    "shifted_mix": shifted_mix,
    "scale_down": scale_down,
    "steady": steady,
    "control_loop_scale": control_loop_scale,
    "fleet": fleet,
    "bls_hop": bls_hop,
    "loadgen_headroom": loadgen_headroom,
    "vegeta": vegeta,
    "model_accuracy": model_accuracy,
    "trace": trace,
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
