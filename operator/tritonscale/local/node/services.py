"""Service names for pods, without kube-proxy or cluster DNS: the stand-in's poor man's routing.

Every pod gets its own /etc/hosts (`hosts_file`), rewritten whenever the EndpointSlices
change. A Service's names (`svc`, in the pod's own namespace, and `svc.ns`, `svc.ns.svc`,
`svc.ns.svc.cluster.local`) resolve to the addresses of its ready endpoints, so a client
connects straight to a pod, on the Service's port number: Services must use the same
number for `port` and `targetPort` (the chart's do). There is no cluster IP and no load
balancing: a client takes the first address, and each pod's file lists the endpoints in
a different rotation, so that different clients tend to different pods. The API server is
`kubernetes.default.svc` (and its shorter names) at the node's gateway, where
`network.ApiForwarder` listens. gRPC's default resolver (c-ares) does not read the hosts
file, so the node sets GRPC_DNS_RESOLVER=native in every container.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
API_NAMES = (
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)

Routes = Mapping[tuple[str, str], list[str]]


def routes_from_slices(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """(namespace, service) -> ready endpoint addresses, sorted, from EndpointSlice objects."""
    routes: dict[tuple[str, str], set[str]] = {}
    for item in slices:
        metadata = item.get("metadata") or {}
        service = (metadata.get("labels") or {}).get(SERVICE_NAME_LABEL)
        if not service:
            continue
        addresses = routes.setdefault((metadata.get("namespace", ""), service), set())
        for endpoint in item.get("endpoints") or []:
            # An unset `ready` means ready (discovery.k8s.io/v1).
            if (endpoint.get("conditions") or {}).get("ready") is not False:
                addresses.update(endpoint.get("addresses") or [])
    return {key: sorted(value) for key, value in routes.items()}


def hosts_file(
    pod_name: str,
    pod_ip: str,
    namespace: str,
    gateway: str,
    routes: Routes,
    rotation: int,
) -> str:
    api_names = ("kubernetes", *API_NAMES) if namespace == "default" else API_NAMES
    lines = [
        "# Written by the tritonscale node stand-in: Service names -> ready endpoints.",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{pod_ip}\t{pod_name}",
        f"{gateway}\t{' '.join(api_names)}",
    ]
    for (service_namespace, service), addresses in sorted(routes.items()):
        if not addresses:
            continue
        names = [f"{service}.{service_namespace}", f"{service}.{service_namespace}.svc",
                 f"{service}.{service_namespace}.svc.cluster.local"]  # fmt: skip
        if service_namespace == namespace:
            names.insert(0, service)
        turn = rotation % len(addresses)
        for address in addresses[turn:] + addresses[:turn]:
            lines.append(f"{address}\t{' '.join(names)}")
    return "\n".join(lines) + "\n"
