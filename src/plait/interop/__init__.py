"""Weights in and out of plait: a run's checkpoint as one full model, and the Hugging Face layout."""
