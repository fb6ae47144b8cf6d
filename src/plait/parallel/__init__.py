"""apply_* steps that spread a single-device model over the mesh, from outside the model."""
