"""The one exception type for bad input: its message is a single sentence the user can act on."""


class ConfigError(ValueError):
    """An invalid model, layout, training setting, file or flag, reported before any worker starts."""


class RankZeroVerdict(ConfigError):
    """Rank 0's check of a start that every rank meets together (under a torchrun plait did not start):
    every rank raises it, rank 0 says it, and no rank leaves before rank 0 has said it."""
