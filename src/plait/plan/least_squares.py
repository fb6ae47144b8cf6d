"""The one fit calibration uses: linear least squares on relative errors (pure Python)."""

from __future__ import annotations


def relative_least_squares(rows: list[tuple[float, float]], times: list[float]) -> tuple[float, float]:
    """(x, y) minimising Σ((a·x + b·y − t)/t)² over rows (a, b) and times t: relative errors count."""
    aa = sum((a / t) ** 2 for (a, _), t in zip(rows, times))
    bb = sum((b / t) ** 2 for (_, b), t in zip(rows, times))
    ab = sum(a * b / t**2 for (a, b), t in zip(rows, times))
    at = sum(a / t for (a, _), t in zip(rows, times))
    bt = sum(b / t for (_, b), t in zip(rows, times))
    det = aa * bb - ab * ab
    return (at * bb - bt * ab) / det, (aa * bt - ab * at) / det
