"""`make drills`: day-2 operations on the real node under a steady load, every request counted.

Each drill runs while Locust (loadtests/bls.py, over gRPC, each user at a fixed pace: an
open-loop load far below the pods' capacity) sends pipeline_async requests to the Triton
Service's cluster IP, through the node's kube-proxy, and writes every request to a log
(`--request-log`). A drill's figures come from that log: the requests sent from its start
to its end, the failed ones, and the p95 during it against the window before it.

    rollout        helm upgrade that rolls the Triton pods (a changed pod annotation)
    rollout-http   the same with an HTTP/1.1 keep-alive load beside (the bound HTTP clients get)
    scale-in       the Deployment 3 -> 1
    pod-delete     kubectl delete pod of each Triton pod in turn (one node: no drain)
    failover       SIGKILL of the active operator's container (two replicas, kopf peering)
    apiserver      kube-apiserver stopped and started again
    node-restart   containerd, then the kubelet, restarted
    oom            tritonserver OOM-killed by the kernel at its memory limit
    finalizer      install / uninstall cycles with autoscalers (one in five with a Triton pod)

Beside the failed requests each drill reports `requests_in_flight_at_fault`: the failed ones
that were open when a Triton pod's process ended, killed or drained (the moment seen on the
node in /proc; hack.drills.harness.IN_FLIGHT_BASIS says how and its limits), which
no client can save; None when no Triton process ended.

A drill passes with 0 failed requests, except three that state their bound. `oom`: a killed
process answers nothing, so the requests in flight on that pod are lost, and a client that
fails fast also loses those kube-proxy sends it until the EndpointSlice marks it not ready
and kube-proxy syncs (the load's gRPC user waits for a ready connection instead); the drill
passes when every failure lies in that window, the pod rejoins at its peers' counts, and a
watch of the pod saw it Ready with its readiness gate closed only for the kubelet's moments
(KUBELET_READY_BOUND_S says why).
`rollout-http`: at most one request per HTTP keep-alive connection left on an old pod.
`apiserver`: an outage longer than the node-lifecycle controller's grace period (here the
API server takes about 30 s to start again) lets the controller find the kubelet's lease
stale when the API returns: it marks the node and its pods not ready until the kubelet's
next heartbeat, the EndpointSlices empty, and kube-proxy refuses connections to the Service
meanwhile. Failures are allowed only inside that window, and only when the node was seen
marked not ready.

    python -m hack.drills            # the full drills: reports/drills/NAME.json and a table
    python -m hack.drills --quick    # shorter windows, fewer cycles (`make drills QUICK=1`)

It builds the images, brings up the local cluster in .cluster-drills (hack.cluster), pushes
the images, installs the chart, runs the drills, uninstalls and takes the cluster down, also
after Ctrl-C or a failure. tests/cluster/test_drills.py runs the quick forms of rollout,
scale-in, failover, oom and finalizer on the test session's cluster.

One module per drill (rollout, scale_in, pod_delete, failover, apiserver, node_restart, oom,
finalizer), each a function of `harness.Drills`, the cluster as the drills see it; `harness`
also holds the load and its request log, and `runner` runs the drills one after another and
judges each.
"""

from hack.drills.harness import RELEASE, Drills, Load, Record, Settings
from hack.drills.oom import KUBELET_READY_BOUND_S
from hack.drills.runner import DRILLS, load_on, release_values, run_drill, table

__all__ = [
    "DRILLS",
    "KUBELET_READY_BOUND_S",
    "RELEASE",
    "Drills",
    "Load",
    "Record",
    "Settings",
    "load_on",
    "release_values",
    "run_drill",
    "table",
]
