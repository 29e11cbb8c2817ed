"""Load-generator headroom: Locust's gRPC user against a direct asyncio client, on add_sub.

    python -m loadtests.bench.loadgen_headroom            # full, about a minute
    python -m loadtests.bench.loadgen_headroom --quick    # seconds (CI)

add_sub is the cheapest model: whatever caps its throughput is mostly the client. At each
concurrency, Locust (`loadtests/bls.py --workload add_sub`, one process, N users, no
think time) and tritonclient.grpc.aio with N requests in flight run one after the other;
also the client CPU each spends per request. Where Locust's rate falls short of the asyncio
client's, Locust, not the server, is the bottleneck: run more Locust workers, or measure
with the asyncio client. Result: reports/bench/loadgen_headroom.json (+ .png).
"""

from __future__ import annotations

import time
from typing import Any

from loadtests.bench import common

QUICK = {"users": [2], "seconds": 2, "warmup_s": 0.3}
FULL = {"users": [1, 8, 32], "seconds": 10, "warmup_s": 1.0}


def run(triton: Any, settings: dict) -> dict[str, Any]:
    rows = []
    for users in settings["users"]:
        common.progress(f"  {users} user(s): Locust ...")
        locust = common.locust_run(triton, "add_sub", users, settings["seconds"])
        cpu_before = time.process_time()
        direct = common.measure(
            triton.grpc_url,
            "add_sub",
            common.pair_inputs,
            concurrency=users,
            seconds=settings["seconds"],
            warmup_s=settings["warmup_s"],
        )
        cpu = time.process_time() - cpu_before
        direct_row = direct.to_dict()
        direct_row["client_cpu_ms_per_request"] = (
            round(1000 * cpu / direct.requests, 3) if direct.requests else None
        )
        row = {
            "users": users,
            "locust": locust,
            "asyncio": direct_row,
            "locust_over_asyncio": common.ratio(locust["throughput_rps"], direct.throughput_rps),
        }
        rows.append(row)
        common.progress(
            f"  {users} user(s): Locust {locust['throughput_rps']:.0f} rps, asyncio "
            f"{direct.throughput_rps:.0f} rps (Locust/asyncio {row['locust_over_asyncio']})"
        )
    return {"settings": settings, "model": "add_sub", "by_users": rows}


def plot(rows: list[dict], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    users = [r["users"] for r in rows]
    axes.plot(users, [r["locust"]["throughput_rps"] for r in rows], "o-", label="Locust gRPC user")
    axes.plot(users, [r["asyncio"]["throughput_rps"] for r in rows], "s-", label="grpc.aio client")
    axes.set_xlabel("users / requests in flight")
    axes.set_ylabel("add_sub requests/s")
    axes.set_title("Load-generator headroom")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    with common.local_triton(["add_sub"]) as triton:
        result = run(triton, QUICK if args.quick else FULL)
    path = common.write_result("loadgen_headroom", result, args.out)
    if not args.no_plot:
        plot(result["by_users"], common.plot_path(path))


if __name__ == "__main__":
    main()
