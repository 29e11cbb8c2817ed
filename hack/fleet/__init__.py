"""A fleet of fake Triton pods on a real API server, for measuring the operator at scale.

`build` builds KWOK, `triton` answers as every pod's Triton from one process, `fleet` brings
the control plane, KWOK, the pods, Prometheus and the operator up, and `netns` runs it all in
a network namespace of its own. `python -m hack.fleet` keeps one up by hand;
`loadtests/bench/fleet.py` measures it. Development tooling, not product.
"""
