"""Drivers: the Kubernetes operator (kopf) and the local driver (`tritonscale tune`)."""
