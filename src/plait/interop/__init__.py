"""Weights in and out of plait: Hugging Face's file layout."""
