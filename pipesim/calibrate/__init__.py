"""Calibration: turning measurements of a box into a profile, and checking a profile
against measured end-to-end runs.

- `fit`, `validate`, `diagnose`: a profile's free parameters fitted to its measured
  end-to-end points (profiles/measured.py), predictions against them, and where a box
  loses time;
- `corpus`, `corpus_scenario`, `crosscheck`, `corpus_report`, `residuals`: the public
  validation corpus, its runs as scenarios, the check against them and the residuals
  the bands are fitted from;
- `live/`: measuring a model's operation tables on the visible NVIDIA GPUs.

Importers of other tools' measurements live in profiles/importers/ (the core reads
their tables).

Nothing is imported here: `import pipesim` must not pull in scipy, torch or the importers.
"""
