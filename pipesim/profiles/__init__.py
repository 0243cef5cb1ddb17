"""What was measured on a box: calibration profiles, their tables and curves, measured points, importers, the catalogue."""
