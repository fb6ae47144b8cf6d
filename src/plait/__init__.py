"""plait: transformer training with every standard form of parallelism on one device mesh."""

__version__ = "0.1.0"
