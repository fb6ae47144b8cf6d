"""The training loop and what it needs: data, optimizer, checkpoints, launch."""
