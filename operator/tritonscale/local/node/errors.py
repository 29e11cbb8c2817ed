"""The one error the node stand-in raises to its user."""

from __future__ import annotations


class NodeError(RuntimeError):
    """The node stand-in cannot start or run a pod; the message is one line for a person."""
