"""The planner: per-rank memory and step time for any model, cluster and layout (pure Python)."""
