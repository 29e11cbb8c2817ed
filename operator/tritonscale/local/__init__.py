"""Local tooling: a real tritonserver and Prometheus on this machine, the demo and its load, and
the node stand-in. (The local Kubernetes cluster is development tooling: hack/ in a checkout.)"""
