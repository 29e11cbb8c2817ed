"""Delete a release's InstanceGroupAutoscalers while its operator still runs: the chart's
pre-delete hook.

    python3 delete_autoscalers.py --namespace ml \\
        --selector app.kubernetes.io/instance=demo,app.kubernetes.io/component=autoscaler

The operator (kopf) keeps a finalizer on each autoscaler it serves and removes it once that
object's timer has stopped. `helm uninstall` deletes the operator, its Role and the
autoscalers together, so the finalizers would stay and the autoscalers (and their
namespace) would hang in Terminating. This runs before: it deletes the release's
autoscalers and waits until the operator has let them go. One still there after --timeout
(no operator running) loses the finalizer here: the operator keeps no state outside the
object, so nothing is left undone. Exit 0 once none is left, 1 with one line otherwise.
Standard library only, with the pod's service account (in-cluster).
"""

import argparse
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
PLURAL = "apis/tritonscale.io/v1alpha1/namespaces/{namespace}/instancegroupautoscalers"


class Api:
    def __init__(self) -> None:
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        host = f"[{host}]" if ":" in host else host
        self.base = f"https://{host}:{os.environ['KUBERNETES_SERVICE_PORT']}"
        self.context = ssl.create_default_context(cafile=f"{ACCOUNT}/ca.crt")

    def call(self, method: str, path: str, body: dict | None = None, patch: bool = False):
        with open(f"{ACCOUNT}/token") as token:  # re-read: the kubelet renews it
            headers = {"Authorization": f"Bearer {token.read().strip()}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = (
                "application/merge-patch+json" if patch else "application/json"
            )
        request = urllib.request.Request(
            f"{self.base}/{path}", data=data, headers=headers, method=method
        )
        with urllib.request.urlopen(request, timeout=30, context=self.context) as response:
            return json.load(response)


def names(api: Api, collection: str, selector: str) -> list[str]:
    query = urllib.parse.urlencode({"labelSelector": selector})
    try:
        items = api.call("GET", f"{collection}?{query}")["items"]
    except urllib.error.HTTPError as error:
        if error.code == 404:  # no CRD, so no autoscaler
            return []
        raise
    return [item["metadata"]["name"] for item in items]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--selector", required=True)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    api = Api()
    collection = PLURAL.format(namespace=args.namespace)
    try:
        for name in names(api, collection, args.selector):
            try:
                api.call("DELETE", f"{collection}/{name}")
            except urllib.error.HTTPError as error:
                if error.code != 404:
                    raise
        deadline = time.monotonic() + args.timeout
        while left := names(api, collection, args.selector):
            if time.monotonic() > deadline:
                print(f"the operator did not release {', '.join(left)} within "
                      f"{args.timeout:.0f} s: removing its finalizer")  # fmt: skip
                for name in left:
                    body = {"metadata": {"finalizers": None}}
                    try:
                        api.call("PATCH", f"{collection}/{name}", body, patch=True)
                    except urllib.error.HTTPError as error:
                        if error.code != 404:
                            raise
                deadline = float("inf")
            time.sleep(1.0)
    except (OSError, KeyError, ValueError) as error:
        print(f"deleting the autoscalers failed: {error}", file=sys.stderr)
        return 1
    print(f"no autoscaler left in {args.namespace} for {args.selector}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
