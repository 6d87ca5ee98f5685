"""Drafter training: target-written data, features, the training loop, checkpoints and held-out evaluation."""
