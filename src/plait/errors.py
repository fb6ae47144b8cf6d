"""The one exception type for bad input: its message is a single sentence the user can act on."""


class ConfigError(ValueError):
    """An invalid model, layout, training setting, file or flag, reported before any worker starts."""
