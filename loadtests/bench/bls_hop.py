"""The cost of a BLS hop: bls_sync and bls_async against calling add_sub directly.

    python -m loadtests.bench.bls_hop            # full, about a minute
    python -m loadtests.bench.bls_hop --quick    # seconds (CI)

bls_sync forwards to add_sub with one blocking exec(); bls_async awaits two async_exec()
calls (pytorch and add_sub) together. All at one instance, measured one after another at
each concurrency. Result: reports/bench/bls_hop.json (+ .png).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loadtests.bench import common

MODELS = ("add_sub", "bls_sync", "bls_async")
QUICK = {"concurrency": [1], "seconds": 1.0, "warmup_s": 0.3}
FULL = {"concurrency": [1, 8], "seconds": 8.0, "warmup_s": 1.0}


def _inputs(model: str) -> Any:
    if model == "bls_sync":
        return lambda rng: {
            **common.pair_inputs(rng),
            "MODEL_NAME": np.array([b"add_sub"], dtype=object),
        }
    return common.pair_inputs


def run(triton: Any, settings: dict) -> dict[str, Any]:
    instances = common.Instances(triton)
    try:
        instances.set(dict.fromkeys((*MODELS, "pytorch"), 1))
        rows = []
        for concurrency in settings["concurrency"]:
            runs = {
                model: common.measure(
                    triton.grpc_url,
                    model,
                    _inputs(model),
                    concurrency=concurrency,
                    seconds=settings["seconds"],
                    warmup_s=settings["warmup_s"],
                )
                for model in MODELS
            }
            direct = runs["add_sub"]
            row: dict[str, Any] = {"concurrency": concurrency}
            for model, m in runs.items():
                row[model] = m.to_dict()
            for model in ("bls_sync", "bls_async"):
                m = runs[model]
                row[f"{model}_hop_p50_ms"] = (
                    round(m.p50_ms - direct.p50_ms, 3) if m.p50_ms and direct.p50_ms else None
                )
                row[f"{model}_latency_ratio_p50"] = common.ratio(m.p50_ms, direct.p50_ms)
                row[f"{model}_throughput_ratio"] = common.ratio(
                    m.throughput_rps, direct.throughput_rps
                )
            rows.append(row)
            common.progress(
                f"  {concurrency} in flight: p50 add_sub {direct.p50_ms or 0:.2f} ms, "
                f"bls_sync {runs['bls_sync'].p50_ms or 0:.2f} ms, "
                f"bls_async {runs['bls_async'].p50_ms or 0:.2f} ms"
            )
    finally:
        instances.restore()
    return {"settings": settings, "models": list(MODELS), "by_concurrency": rows}


def plot(rows: list[dict], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(MODELS)
    for index, model in enumerate(MODELS):
        xs = [i + (index - 1) * width for i in range(len(rows))]
        axes.bar(xs, [r[model]["p50_ms"] or 0 for r in rows], width, label=f"{model} p50")
        axes.scatter(xs, [r[model]["p95_ms"] or 0 for r in rows], marker="_", s=200, color="k")
    axes.set_xticks(range(len(rows)), [f"{r['concurrency']} in flight" for r in rows])
    axes.set_ylabel("ms (bar p50, tick p95)")
    axes.set_title("BLS hop: latency of a BLS call vs add_sub directly")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    with common.local_triton(["add_sub", "pytorch", "bls_sync", "bls_async"]) as triton:
        result = run(triton, QUICK if args.quick else FULL)
    path = common.write_result("bls_hop", result, args.out)
    if not args.no_plot:
        plot(result["by_concurrency"], common.plot_path(path))


if __name__ == "__main__":
    main()
