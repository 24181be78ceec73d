"""The training loop and what it needs: config, model, data, checkpoints, stop agreement. No cloud import."""
