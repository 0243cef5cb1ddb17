"""Many predictions: sweeps, their workers and files, the search, the figures."""
