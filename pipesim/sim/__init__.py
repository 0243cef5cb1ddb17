"""The discrete-event simulation: environment, links, pipeline, request lifecycle, data parallelism, one run."""
