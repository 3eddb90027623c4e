"""Trained reference models: the yardstick of ``tokenmerge eval`` (models, data, training, measurements)."""
