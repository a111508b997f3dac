"""The sweeps' error for a bad configuration (a leaf module: everything may import it)."""
from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A bad config; ``field`` names the offending entry (``grid.sigma[2]``)."""

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")
