"""Local tooling: a real tritonserver and Prometheus on this machine, the demo and its load.
(The local Kubernetes cluster is development tooling: hack/ in a checkout.)"""
