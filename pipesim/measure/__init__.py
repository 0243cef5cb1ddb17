"""What a run recorded and its figures: rows, tallies, the steady state, percentiles, saturation, metrics."""
