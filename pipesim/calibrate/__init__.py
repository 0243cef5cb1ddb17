"""Calibration: turning measurements of a box into a profile, and checking a profile
against measured end-to-end runs.

- `measured`: measured end-to-end points (a profile's measured.csv);
- `importers/`: tables and points from AIConfigurator, nccl-tests and serving benchmarks;
- `live/`: measuring a model's operation tables on the visible NVIDIA GPUs;
- `fit`, `validate`, `diagnose`: free parameters fitted to the points, predictions
  against them, and where a box loses time.

Nothing is imported here: `import pipesim` must not pull in scipy, torch or the importers.
"""
