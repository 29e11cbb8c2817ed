"""node-restart: containerd, then the kubelet, restarted under load."""

from __future__ import annotations

import time
from pathlib import Path

from hack import cluster, node
from hack.demo_k8s import DemoError, wait_for
from hack.drills.harness import TRITON, Drills, Record, is_node_ready


def node_restart(drills: Drills) -> tuple[Record, float, float]:
    record = Record("node-restart")
    restarts = drills.restarts()
    start = time.time()
    state = node.read_state(drills.state_dir) or {}
    kubelet_health = f"http://127.0.0.1:{state['ports']['kubelet-healthz']}/healthz"
    back = {
        "containerd": lambda: node.ctr_answers(Path(state["containerd_address"])),
        "kubelet": lambda: node.http_ok(kubelet_health),
    }
    for component in ("containerd", "kubelet"):
        cluster.restart(drills.state_dir, component, down_s=drills.settings.down_s)
        wait_for(f"{component} back", back[component], timeout_s=120)
        wait_for("the node Ready", lambda: _node_ready(drills), timeout_s=180)
    drills.wait_tuned(len(drills.pods(TRITON)), timeout_s=180)
    end = time.time()
    record.recovery_s = round(end - start, 1)
    record.detail = {"down_s": drills.settings.down_s, "restarts": drills.restarts_since(restarts)}
    return record, start, end


def _node_ready(drills: Drills) -> bool:
    try:
        nodes = drills.k.items("nodes")
    except DemoError:
        return False
    return all(is_node_ready(n) for n in nodes)
