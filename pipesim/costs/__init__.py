"""Seconds per operation: primitive kernels and collectives, expert parallel, a stage, a data-parallel step."""
