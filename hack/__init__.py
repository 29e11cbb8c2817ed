"""Development tooling, not product: a local Kubernetes built from upstream sources (`cluster`,
`node`), the chart's demo on it (`demo_k8s`), the images (`images`) and the outside load
generator vegeta (`vegeta`). What the cluster's modules share lies beneath them: processes
(`processes`), certificates (`pki`), Go builds (`gotools`, `kubernetes_build`). Run from a
checkout's root, e.g. `python -m hack.cluster up`. The package `tritonscale` never imports
this, and the wheel does not carry it."""
