"""Local tooling: a real tritonserver and Prometheus on this machine, the demo and its load, and a
local Kubernetes control plane built from upstream sources."""
