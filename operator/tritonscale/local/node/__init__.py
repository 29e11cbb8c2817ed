"""A kubelet stand-in for a local control plane: pods run as local processes (a test harness).

The way KWOK fakes kubelets, `Node` registers a Node with a real API server (the one of
`hack.cluster`), but unlike KWOK it runs each pod for real, from its spec:

- scheduling: there is no kube-scheduler; the node binds Pending pods (the `binding`
  subresource) that fit its capacity and match their nodeSelector, and says why not
  (FailedScheduling) otherwise;
- images: an image is a role mapped to programs of this machine (`images`): Triton's image
  runs the nvidia-pytriton wheel's `tritonserver`, the operator image this environment's
  `tritonscale`, `locust` and `python3`; a container runs its own command and args, with its
  env ($(VAR) expanded, Secrets and ConfigMaps and the downward API resolved);
- sandboxes (`sandbox`): each pod has a network namespace (address 10.244.N.P on the
  node's bridge, its own loopback: two Tritons both listen on 8000) and a mount namespace
  whose root mirrors the machine plus the pod's volumes at their mountPaths (`volumes`:
  ConfigMaps, Secrets, the projected service account token, emptyDirs, Memory emptyDirs as
  tmpfs, so each pod has its own /dev/shm);
- the API server from a pod: in-cluster configuration works (`kubernetes.default.svc:443`
  is the node's gateway, forwarded to the API server), with the pod's own service account
  token, so the API server applies the pod's RBAC to every call;
- Services (`services`): no kube-proxy and no DNS; each pod's /etc/hosts maps Service
  names to their ready endpoints (port must equal targetPort);
- status (`pod`, `containers`): podIP, phase, container states, restartCount, lastState,
  startup/liveness/readiness probes (httpGet, tcpSocket, exec), readinessGates, restarts
  with back-off, preStop hooks and terminationGracePeriodSeconds on deletion, Jobs'
  pods that complete.

Not stood in for: resource limits (nothing is enforced), runAsUser and capabilities (the
processes run as the stand-in's user; PodSecurity admission still checks the specs), node
affinity beyond nodeSelector, taints, port != targetPort, `kubectl logs/exec/port-forward`
(`Node.logs` reads a container's output), image pulls. It needs root (namespaces) and
Linux. Everything it creates carries its slot's prefix and goes when it stops, or when the
next stand-in starts after a crash.

    python -m tritonscale.local.node --kubeconfig .cluster/kubeconfig   # until Ctrl-C
"""

from tritonscale.local.node.errors import NodeError
from tritonscale.local.node.kubelet import Node

__all__ = ["Node", "NodeError"]
