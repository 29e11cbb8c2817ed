"""rollout: helm upgrade that rolls the Triton pods (a changed pod annotation); rollout-http:
the same with an HTTP/1.1 keep-alive load beside (the bound HTTP clients get)."""

from __future__ import annotations

import time

from hack.demo_k8s import CHART, wait_for
from hack.drills.harness import (
    RELEASE,
    TRITON,
    USERS,
    Drills,
    Load,
    Record,
    count_in_flight,
    note_failure_span,
    tally,
    tritonserver_exits,
)


def rollout(drills: Drills) -> tuple[Record, float, float]:
    record = Record("rollout")
    old = {p["metadata"]["name"] for p in drills.pods(TRITON)}
    replicas = len(old)
    start = time.time()
    drills.k(
        "helm", "upgrade", RELEASE, str(CHART), "-n", drills.namespace, "--reuse-values",
        "--set-string", f"triton.podAnnotations.drill-rollout={int(start)}", timeout=120,
    )  # fmt: skip
    wait_for(
        "the rollout: new Triton pods tuned, the old ones gone",
        lambda: (
            drills.tuned(replicas)
            and not old & {p["metadata"]["name"] for p in drills.pods(TRITON)}
        ),
        timeout_s=600,
    )
    end = time.time()
    record.recovery_s = round(end - start, 1)
    record.detail = {"pods_replaced": replicas}
    return record, start, end


def rollout_over_http(drills: Drills, grpc_load: Load) -> Record:
    """The rollout again, with an HTTP load beside the gRPC one: HTTP/1.1 keep-alive clients
    get no signal to leave a stopping pod (Triton 2.51 neither closes idle connections nor
    answers `Connection: close` while it drains), so each connection still on an old pod when
    Triton exits can lose the one request in flight on it. The drill passes when the HTTP
    failures stay within that bound (users x pods replaced) and the gRPC load loses none."""
    log = grpc_load.log.with_name("requests-http.jsonl")
    with Load(drills.service_ip(), log, protocol="http") as http_load:
        drills.settle()
        with tritonserver_exits(drills) as ended:
            record, start, end = rollout(drills)
        time.sleep(2)
        requests = http_load.requests()
        failed = tally(record, requests, start, end, drills.settings.before_s)
        count_in_flight(record, requests, ended, start, end)
    record.drill = "rollout-http"
    bound = USERS * record.detail["pods_replaced"]
    grpc_failed = sum(
        1 for r in grpc_load.requests() if start <= r["start"] <= end and r["error"] is not None
    )
    record.allowed_failures = (
        f"{bound}: one request in flight per HTTP keep-alive connection on an old pod when "
        "Triton exits (Triton's HTTP server does not tell clients to leave)"
    )
    record.detail["grpc_failed_meanwhile"] = grpc_failed
    note_failure_span(record, failed, start)
    record.passed = record.requests_sent > 0 and len(failed) <= bound and grpc_failed == 0
    return record
