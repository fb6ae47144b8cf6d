"""Model shapes (pure Python) and the single-device transformer (torch, imported on demand)."""

from plait.models.flops import FlopCount, flops_per_sequence, parameter_count
from plait.models.spec import PRESETS, ModelSpec, model_spec

__all__ = ["FlopCount", "ModelSpec", "PRESETS", "flops_per_sequence", "model_spec", "parameter_count"]
