"""Testing helpers: tiny random-weight checkpoints of every supported family (`tiny.build`)."""
