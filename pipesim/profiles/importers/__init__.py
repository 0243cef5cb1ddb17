"""Importers of other tools' measurements into a profile: AIConfigurator's tables
(aiconfigurator, aiconfigurator_layout), nccl-tests output (nccl_tests), serving
benchmarks' results (bench)."""
