"""One inference through Triton's HTTP v2 API, checked: the chart's `helm test`.

    python3 check_inference.py --url http://SERVICE:8000 --model bls_async

Sends INPUT0 and INPUT1 (FP32 [4]) to a model with the add_sub interface (add_sub,
bls_async, bls_sync without MODEL_NAME is not one) and checks OUTPUT0 = INPUT0 + INPUT1
and OUTPUT1 = INPUT0 - INPUT1. Exit 0 on the right answer, 1 with one line otherwise.
Standard library only, so any image with python3 runs it.
"""

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request

INPUT0 = [1.0, 2.0, 3.0, 4.0]
INPUT1 = [10.0, 20.0, 30.0, 40.0]


def infer(base: str, model: str, timeout: float) -> dict:
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": INPUT0},
            {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": INPUT1},
        ],
        "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}],
    }
    request = urllib.request.Request(
        f"{base}/v2/models/{urllib.parse.quote(model, safe='')}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def check(reply: dict) -> str | None:
    """None when the outputs are right, else what is wrong."""
    outputs = {output["name"]: output.get("data") for output in reply.get("outputs", [])}
    expected = {
        "OUTPUT0": [a + b for a, b in zip(INPUT0, INPUT1, strict=True)],
        "OUTPUT1": [a - b for a, b in zip(INPUT0, INPUT1, strict=True)],
    }
    for name, want in expected.items():
        got = outputs.get(name)
        if got is None:
            return f"{name} missing from the reply"
        if len(got) != len(want) or any(abs(g - w) > 1e-4 for g, w in zip(got, want, strict=True)):
            return f"{name} is {got}, expected {want}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one checked inference against Triton.")
    parser.add_argument("--url", required=True, help="Triton's HTTP base URL")
    parser.add_argument("--model", default="bls_async")
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    try:
        reply = infer(args.url.rstrip("/"), args.model, args.timeout)
    except urllib.error.HTTPError as error:
        print(
            f"FAIL: {args.model}: HTTP {error.code}: {error.read().decode(errors='replace')[:300]}"
        )
        return 1
    except (urllib.error.URLError, OSError, ValueError) as error:
        print(f"FAIL: {args.model}: {error}")
        return 1
    problem = check(reply)
    if problem:
        print(f"FAIL: {args.model}: {problem}")
        return 1
    print(f"OK: {args.model} returned the sum and the difference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
