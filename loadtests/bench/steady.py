"""Steady load for ten minutes with the demo's windows: once the counts have reacted, does
any change go back on the one before it?

    python -m loadtests.bench.steady               # ten minutes (about 11 with start-up)
    python -m loadtests.bench.steady --minutes 30  # longer
    python -m loadtests.bench.steady --quick       # 45 s (CI)

1. The demo's set-up (tritonscale.local.demo.run_demo, on free ports): a local Triton with
   pipeline_async and its three branches, a local Prometheus when installed, the demo's
   short-window policies (operator/examples/local/policies.yaml: 5 s ticks, 10 s rates,
   30 s scale-down window), the capacity at one instance each.
2. One phase: an open-loop load at the demo's high rate (1.4 times that capacity), the
   operator running from one instance each, unchanged to the end.
3. Every applied change, and the reversals among them: a change against the model's
   previous one, after the first 30 s (the reaction to the step). Steady load should give none.
   An increase the verifier gives back once (StepFellShort) is counted apart.

Result: reports/bench/steady.json (+ .png); the demo's files (decision log, the load's
history, the HTML report) in reports/bench/steady/.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loadtests.bench import common
from tritonscale.local.demo import MODELS, POLICIES, Phase, run_demo
from tritonscale.local.ports import free_ports

LOAD = 1.4  # the demo's high phase, as a multiple of the capacity at one instance each
REACTION_S = 30.0  # as the demo counts reversals
FULL = {"seconds": 600.0, "capacity_seconds": 6.0}
QUICK = {"seconds": 45.0, "capacity_seconds": 2.0}


def run(settings: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    phase = Phase("steady", LOAD, settings["seconds"])
    *triton_ports, prometheus_port = free_ports(4)
    result = run_demo(
        out_dir,
        phases=(phase,),
        ports=tuple(triton_ports),
        metrics_port=0,
        prometheus_port=prometheus_port,
        policies=common.REPO_ROOT / POLICIES,
        capacity_seconds=settings["capacity_seconds"],
        echo=common.progress,
    )
    (row,) = result.rows
    decisions = [
        json.loads(line) for line in result.decision_log.read_text().splitlines() if line.strip()
    ]
    changes = [
        {
            "after_s": round(d["t"] - row.start, 1),
            "model": d["model"],
            "before": pod["before"],
            "after": pod["after"],
            "reason": d["decisionReason"],
        }
        for d in decisions
        for pod in d["applied"]
        if pod["ok"] and pod["before"] is not None and pod["after"] is not None
    ]
    counts = [
        {
            "after_s": round(d["t"] - row.start, 1),
            "model": d["model"],
            "count": min(d["live"].values()),
        }
        for d in decisions
        if d["live"]
    ]
    whole, end = row.load, row.end_load
    return {
        "settings": settings,
        "seconds": settings["seconds"],
        "load_multiple": LOAD,
        "capacity_rps": round(result.capacity_rps, 1),
        "metrics": result.metrics,
        "offered_rps": round(whole.offered_rps, 1) if whole else None,
        "served_rps": round(whole.served_rps, 1) if whole else None,
        "failed_or_dropped": (whole.failed + whole.dropped) if whole else None,
        "p95_ms_last_10s": round(end.p95_ms, 1) if end and end.p95_ms is not None else None,
        "p95_objective_ms": result.p95_objective_ms,
        "seconds_to_objective": result.seconds_to_objective,
        "reaction_s": REACTION_S,
        "reversals": {model: result.reversals.get(model, 0) for model in MODELS},
        "given_back": {model: result.given_back.get(model, 0) for model in MODELS},
        "changes_after_reaction": sum(1 for c in changes if c["after_s"] >= REACTION_S),
        "changes": changes,
        "instances_end": row.instances_end,
        "instances_max": row.instances_max,
        "counts": counts,
        "decisions": len(decisions),
        "demo_files": str(out_dir),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(10, 4.5))
    for model in MODELS:
        points = [(c["after_s"], c["count"]) for c in result["counts"] if c["model"] == model]
        if points:
            axes.step(*zip(*points, strict=True), where="post", label=model)
    axes.axvline(result["reaction_s"], color="grey", linestyle=":", label="reversals counted from")
    axes.set_xlabel("seconds under the steady load")
    axes.set_ylabel("instances")
    flaps = sum(result["reversals"].values())
    axes.set_title(
        f"{result['offered_rps']:.0f} req/s offered for {result['seconds'] / 60:g} min "
        f"({result['load_multiple']:g} x capacity at 1 each): {flaps} reversals"
    )
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = common.parser(__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, help="Length of the steady load (default 10)")
    args = parser.parse_args(argv)
    settings = dict(QUICK if args.quick else FULL)
    if args.minutes is not None:
        if args.minutes <= REACTION_S / 60:
            parser.error(f"--minutes must be longer than the {REACTION_S:g} s reaction")
        settings["seconds"] = args.minutes * 60
    out = args.out or common.RESULTS_DIR / "steady.json"
    result = run(settings, out.with_suffix(""))
    common.write_outputs("steady", result, args, plot)
    common.progress(
        f"steady {result['seconds']:g} s: {result['changes_after_reaction']} changes after the "
        f"first {REACTION_S:g} s, reversals {result['reversals']}, served {result['served_rps']} "
        f"of {result['offered_rps']} req/s, p95 {result['p95_ms_last_10s']} ms at the end"
    )


if __name__ == "__main__":
    main()
