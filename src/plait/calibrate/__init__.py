"""``plait calibrate``: measure this machine into a hardware profile the planner reads.

Needs torch and runs plait's own layers, so it lives outside the torch-free ``plait.plan``.
"""
