"""The facts both the engine and the planner compute, each in one place, in pure Python.

Bytes of model state and parameters per rank (``model_state``), activation bytes per layer
(``activations``), collective volumes per layer (``collectives``), micro-batches in flight
(``in_flight``), the learning-rate schedules' shapes (``lr_schedule``), the software stack a
prediction models (``stack``) and the one validation of a run (``validity``). Nothing here imports
torch or any other plait package but models, layout, schedules and errors.
"""
