"""`python -m hack.drills [--quick] [DRILL ...]`: the drills (hack.drills), a JSON report each
and a table; exit 1 unless every drill passed."""

from __future__ import annotations

import argparse
import signal
import sys

import hack.drills
from hack.demo_k8s import CLUSTER_ERRORS, say
from hack.drills.harness import Settings
from hack.drills.runner import DRILLS, run, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.drills", description=hack.drills.__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="short windows, few cycles")
    parser.add_argument("drills", nargs="*", help=f"default: all of {', '.join(DRILLS)}")
    args = parser.parse_args(argv)
    unknown = [name for name in args.drills if name not in DRILLS]
    if unknown:
        parser.error(f"unknown drill {', '.join(unknown)}; choose from {', '.join(DRILLS)}")
    settings = Settings.quick() if args.quick else Settings()
    names = args.drills or list(DRILLS)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        records = run(names, settings)
    except KeyboardInterrupt:
        say("interrupted: the cluster is down")
        return 130
    except CLUSTER_ERRORS as error:
        print(f"drills: {error}", file=sys.stderr)
        return 1
    say("")
    for line in table(records):
        say(line)
    return 0 if all(r.passed for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
