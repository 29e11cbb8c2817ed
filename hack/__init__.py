"""Development tooling: not product, kept out of the wheel and the operator image."""
