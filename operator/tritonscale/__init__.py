"""Tritonscale: Triton's async BLS pipelines on Kubernetes, with instance counts tuned from metrics."""

__version__ = "0.1.0"

# The HTTP header (and gRPC metadata key) that unlocks Triton's model-repository API.
# Triton runs with --http-restricted-api / --grpc-restricted-protocol keyed on it; its
# value comes from a Kubernetes Secret or TRITONSCALE_REPOSITORY_KEY and is never logged.
REPOSITORY_KEY_HEADER = "tritonscale-repository-key"
REPOSITORY_KEY_ENV = "TRITONSCALE_REPOSITORY_KEY"
# Triton 2.51 prefixes the gRPC metadata key of a restricted protocol with this.
GRPC_REPOSITORY_KEY_HEADER = f"triton-grpc-protocol-{REPOSITORY_KEY_HEADER}"
