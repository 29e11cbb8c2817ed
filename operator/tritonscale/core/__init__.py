"""The policy core: the autoscaler spec and the pure functions that size a model. No I/O."""
