"""The control tick shared by both drivers, and the operator's own metrics."""
