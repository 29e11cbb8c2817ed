"""The Triton side: one client of Triton's HTTP API, the actuator that sets instance counts, and self-healing."""
