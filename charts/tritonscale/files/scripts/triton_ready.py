"""Readiness of one Triton pod: the server is ready and so is every model named.

Run by the pod's readiness probe: python3 triton_ready.py [--url URL] MODEL...
A dead Python stub can leave /v2/health/ready at 200, so the models that matter are
asked one by one (/v2/models/{m}/ready). Exit 0 when all answer 200; otherwise print
what is not ready and exit 1. Standard library only: it runs inside the Triton image.

With --wait SECONDS it asks again every 2 s until all are ready, for at most that long
(the headless Locust master's init container): at the limit it prints one line naming
the URL, the limit and what was still not ready, and exits 1.
"""

import argparse
import sys
import time
import urllib.error
import urllib.parse
import urllib.request


def is_ready(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Is the Triton server and every model ready?")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="Triton's HTTP base URL")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per request")
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="ask again every 2 s until ready, for at most this long (0: ask once)",
    )
    parser.add_argument("models", nargs="*", help="models that must be ready")
    args = parser.parse_args(argv)
    base = args.url.rstrip("/")
    paths = ["/v2/health/ready"]
    paths += [f"/v2/models/{urllib.parse.quote(model, safe='')}/ready" for model in args.models]
    deadline = time.monotonic() + args.wait
    while True:
        not_ready = [path for path in paths if not is_ready(base + path, args.timeout)]
        if not not_ready:
            return 0
        if time.monotonic() + 2.0 > deadline:
            break
        time.sleep(2.0)
    if args.wait > 0:
        print(
            f"gave up after {args.wait:.0f} s waiting for Triton at {base}: "
            f"not ready: {', '.join(not_ready)}"
        )
    else:
        print("not ready: " + ", ".join(not_ready))
    return 1


if __name__ == "__main__":
    sys.exit(main())
