"""The cluster's end, last of the cluster tests (this file's name sorts after the others):
`hack.cluster down` leaves nothing behind, and the next `up` cleans up after a crashed one.

They take down the session's cluster; the session's own teardown is then a no-op.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from hack import cluster as hack_cluster
from hack import node as hack_node
from hack import processes as hack_processes
from tests.cluster.conftest import TIMINGS, TOOLS_DIR
from tests.cluster.harness import Cluster
from tests.cluster.test_real_node import PODS, import_busybox, pod_manifest


def busybox_pod(cluster: Cluster, namespace: str) -> None:
    """A pod of busybox in `namespace`, with its address (so with its network namespace)."""
    import_busybox(cluster.state_dir)
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(pod_manifest(PODS[0])))
    cluster.wait(
        f"a pod with an address in {namespace}",
        lambda: cluster.get("pod", PODS[0], "-n", namespace)["status"].get("podIP"),
        timeout_s=120,
        namespace=namespace,
    )


def test_cluster_down_leaves_nothing(cluster: Cluster) -> None:
    busybox_pod(cluster, "last")
    node_state = hack_node.read_state(cluster.state_dir)
    plane_state = json.loads((cluster.state_dir / hack_cluster.STATE_FILE).read_text())
    assert node_state is not None
    namespaces = hack_node._our_netns()
    assert namespaces, "no pod network namespace found before down"
    socket = Path(node_state["containerd_address"])
    assert hack_node.shim_pids(socket), "no containerd shim found before down"

    started = time.monotonic()
    hack_cluster.down(cluster.state_dir, progress=print)
    TIMINGS["cluster down"] = round(time.monotonic() - started, 1)

    pids = {**plane_state["pids"], **node_state["pids"]}
    binaries = {**plane_state["binaries"], **node_state["binaries"]}
    running = [n for n, pid in pids.items() if hack_processes.is_running(pid, binaries[n])]
    assert running == [], f"still running after down: {running}"
    assert hack_node.shim_pids(socket) == [], "containerd shims outlived down"
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert [name for name in namespaces if name in netns] == []
    assert hack_node.kube_chains() == {}, "KUBE-* iptables chains outlived down"
    assert hack_node.kube_ipsets() == [], "kube-router's ipsets outlived down"
    rules = subprocess.run(["ip", "rule", "list"], capture_output=True, text=True).stdout
    assert hack_node.BRIDGE not in rules, f"the Service range's rule outlived down: {rules}"
    bridge = subprocess.run(["ip", "link", "show", hack_node.BRIDGE], capture_output=True)
    assert bridge.returncode != 0, f"the bridge {hack_node.BRIDGE} outlived down"
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(cluster.state_dir) not in mounts, "mounts under the state folder outlived down"
    assert not (cluster.state_dir / "node").exists()


def test_the_next_up_cleans_up_after_a_crashed_cluster(cluster: Cluster) -> None:
    """Every component killed with its pods running (as a lost terminal or a reboot of the
    test's process would leave them): `up` removes what is left and starts afresh."""
    hack_cluster.up(cluster.state_dir, TOOLS_DIR, progress=print)
    busybox_pod(cluster, "crash")
    crashed_netns = hack_node._our_netns()
    for state in (
        hack_node.read_state(cluster.state_dir),
        json.loads((cluster.state_dir / hack_cluster.STATE_FILE).read_text()),
    ):
        assert state is not None
        for pid in state["pids"].values():
            os.kill(pid, signal.SIGKILL)

    hack_cluster.up(cluster.state_dir, TOOLS_DIR, progress=print)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert [name for name in crashed_netns if name in netns] == []
    assert cluster.get("node", hack_node.NODE_NAME)["metadata"]["name"] == hack_node.NODE_NAME
    hack_cluster.down(cluster.state_dir, progress=print)
    assert hack_node.kube_chains() == {} and hack_node.kube_ipsets() == []
    assert str(cluster.state_dir) not in Path("/proc/self/mountinfo").read_text()
