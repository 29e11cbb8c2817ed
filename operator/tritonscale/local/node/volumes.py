"""A pod's volumes, written out as folders before its containers start.

configMap, secret, downwardAPI and projected volumes (including the service account token
that the ServiceAccount admission adds: a TokenRequest bound to the pod, renewed at 80 % of
its life as the kubelet does) become files with their items' paths and modes; emptyDir is
a folder, or with `medium: Memory` a tmpfs of the pod's mount namespace (`sandbox`) limited
to its sizeLimit. Contents are written once, when the pod starts: later changes of a
ConfigMap do not reach running pods (the chart rolls its pods when its ConfigMaps change).
Other kinds (persistentVolumeClaim, hostPath, ...) fail the pod with a message.
"""

from __future__ import annotations

import base64
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from tritonscale.local.node.errors import NodeError
from tritonscale.local.node.kube import Kube, is_status

TOKEN_RENEW_FRACTION = 0.8
DEFAULT_TOKEN_SECONDS = 3600


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """A downward-API fieldRef (`metadata.name`, `metadata.labels['app']`, `status.podIP`...)."""
    metadata, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    simple = {
        "metadata.name": metadata.get("name", ""),
        "metadata.namespace": metadata.get("namespace", ""),
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
    }
    if path in simple:
        return simple[path]
    for kind in ("labels", "annotations"):
        if path == f"metadata.{kind}":
            items = sorted((metadata.get(kind) or {}).items())
            return "\n".join(f'{key}="{value}"' for key, value in items)
        prefix = f"metadata.{kind}['"
        if path.startswith(prefix) and path.endswith("']"):
            return (metadata.get(kind) or {}).get(path[len(prefix) : -2], "")
    raise NodeError(f"fieldRef {path} is not supported by the node stand-in")


def resource_value(container: Mapping[str, Any] | None, ref: Mapping[str, Any]) -> str:
    """A resourceFieldRef (limits.cpu, requests.memory, ...), in units of its divisor."""
    kind, _, name = ref["resource"].partition(".")
    resources = (container or {}).get("resources") or {}
    value = (resources.get(kind) or {}).get(name)
    if value is None:
        return "0"
    divisor = parse_quantity(str(ref.get("divisor", "1")))
    return str(int(-(-parse_quantity(str(value)) // divisor)))  # rounded up, as the kubelet


@dataclass
class _Token:
    path: Path
    service_account: str
    expiration_seconds: int
    audience: str | None
    renew_at: float = 0.0


@dataclass
class PodVolumes:
    """The folders of one pod's volumes, by volume name."""

    folders: dict[str, Path] = field(default_factory=dict)
    memory: dict[Path, int | None] = field(default_factory=dict)  # tmpfs folders, sizes
    tokens: list[_Token] = field(default_factory=list)

    def renew_tokens(self, kube: Kube, pod: Mapping[str, Any], now: float) -> None:
        for token in self.tokens:
            if now >= token.renew_at:
                _write_token(kube, pod, token, now)


def _write(folder: Path, relative: str, data: bytes, mode: int | None) -> None:
    path = (folder / relative).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise NodeError(f"volume item path {relative!r} leaves its volume")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    partial.chmod(mode if mode is not None else 0o644)
    os.replace(partial, path)


def _keyed(
    folder: Path,
    data: Mapping[str, bytes],
    source: Mapping[str, Any],
    default_mode: int | None,
    what: str,
) -> None:
    """configMap/secret items: the listed keys at their paths, or every key at its name."""
    items = source.get("items")
    if items is None:
        items = [{"key": key, "path": key} for key in data]
    for item in items:
        if item["key"] not in data:
            if source.get("optional"):
                continue
            raise NodeError(f"{what} has no key {item['key']!r}")
        _write(folder, item["path"], data[item["key"]], item.get("mode", default_mode))


def _config_map(kube: Kube, namespace: str, name: str, optional: bool) -> dict[str, bytes] | None:
    try:
        config_map = kube.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    except Exception as error:
        if is_status(error, 404):
            if optional:
                return None
            raise NodeError(f'configmap "{name}" not found') from None
        raise
    data = {key: value.encode() for key, value in (config_map.get("data") or {}).items()}
    for key, value in (config_map.get("binaryData") or {}).items():
        data[key] = base64.b64decode(value)
    return data


def _secret(kube: Kube, namespace: str, name: str, optional: bool) -> dict[str, bytes] | None:
    try:
        secret = kube.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
    except Exception as error:
        if is_status(error, 404):
            if optional:
                return None
            raise NodeError(f'secret "{name}" not found') from None
        raise
    return {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}


def _write_token(kube: Kube, pod: Mapping[str, Any], token: _Token, now: float) -> None:
    metadata = pod["metadata"]
    spec: dict[str, Any] = {
        "expirationSeconds": token.expiration_seconds,
        "boundObjectRef": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": metadata["name"],
            "uid": metadata["uid"],
        },
    }
    if token.audience:
        spec["audiences"] = [token.audience]
    answer = kube.post(
        f"/api/v1/namespaces/{metadata['namespace']}/serviceaccounts/{token.service_account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    _write(token.path.parent, token.path.name, answer["status"]["token"].encode(), 0o644)
    token.renew_at = now + TOKEN_RENEW_FRACTION * token.expiration_seconds


def _projected(
    kube: Kube, pod: Mapping[str, Any], folder: Path, volume: Mapping[str, Any], into: PodVolumes
) -> None:
    namespace = pod["metadata"]["namespace"]
    default_mode = volume.get("defaultMode")
    for source in volume.get("sources") or []:
        if "serviceAccountToken" in source:
            spec = source["serviceAccountToken"]
            token = _Token(
                path=folder / spec["path"],
                service_account=pod["spec"].get("serviceAccountName") or "default",
                expiration_seconds=int(spec.get("expirationSeconds", DEFAULT_TOKEN_SECONDS)),
                audience=spec.get("audience"),
            )
            _write_token(kube, pod, token, time.time())
            into.tokens.append(token)
        elif "configMap" in source:
            ref = source["configMap"]
            data = _config_map(kube, namespace, ref["name"], bool(ref.get("optional")))
            if data is not None:
                _keyed(folder, data, ref, default_mode, f'configmap "{ref["name"]}"')
        elif "secret" in source:
            ref = source["secret"]
            data = _secret(kube, namespace, ref["name"], bool(ref.get("optional")))
            if data is not None:
                _keyed(folder, data, ref, default_mode, f'secret "{ref["name"]}"')
        elif "downwardAPI" in source:
            _downward(pod, folder, source["downwardAPI"], default_mode)
        else:
            raise NodeError(f"projected source {sorted(source)} is not supported")


def _downward(
    pod: Mapping[str, Any], folder: Path, volume: Mapping[str, Any], default_mode: int | None
) -> None:
    containers = {c["name"]: c for c in pod["spec"].get("containers") or []}
    for item in volume.get("items") or []:
        if "fieldRef" in item:
            value = field_value(pod, item["fieldRef"]["fieldPath"])
        else:
            ref = item["resourceFieldRef"]
            value = resource_value(containers.get(ref.get("containerName", "")), ref)
        _write(folder, item["path"], value.encode(), item.get("mode", default_mode))


def prepare(kube: Kube, pod: Mapping[str, Any], into: Path) -> PodVolumes:
    """Write every volume of `pod` under `into`/NAME; raise NodeError for what cannot be."""
    namespace = pod["metadata"]["namespace"]
    volumes = PodVolumes()
    shutil.rmtree(into, ignore_errors=True)  # a retried start begins afresh
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        folder = into / name
        folder.mkdir(parents=True)
        volumes.folders[name] = folder
        if "emptyDir" in volume:
            empty_dir = volume["emptyDir"] or {}
            if empty_dir.get("medium") == "Memory":
                limit = empty_dir.get("sizeLimit")
                volumes.memory[folder] = int(parse_quantity(str(limit))) if limit else None
            folder.chmod(0o777)  # as the kubelet makes emptyDirs: any uid may write
        elif "configMap" in volume:
            source = volume["configMap"]
            data = _config_map(kube, namespace, source["name"], bool(source.get("optional")))
            if data is not None:
                what = f'configmap "{source["name"]}"'
                _keyed(folder, data, source, source.get("defaultMode"), what)
        elif "secret" in volume:
            source = volume["secret"]
            data = _secret(kube, namespace, source["secretName"], bool(source.get("optional")))
            if data is not None:
                what = f'secret "{source["secretName"]}"'
                _keyed(folder, data, source, source.get("defaultMode"), what)
        elif "projected" in volume:
            _projected(kube, pod, folder, volume["projected"], volumes)
        elif "downwardAPI" in volume:
            source = volume["downwardAPI"]
            _downward(pod, folder, source, source.get("defaultMode"))
        else:
            kinds = sorted(set(volume) - {"name"})
            raise NodeError(
                f"volume {name!r} of kind {kinds} is not supported by the node stand-in"
            )
    return volumes
