"""Templates: fit, predict, evaluate, feedback."""
