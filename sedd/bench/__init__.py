"""Benchmarks ``sedd bench`` runs: precisions side by side (``precisions``), and st3's sampling
pattern against our default on the bundled model, with quality and MFU (``compare``)."""

from sedd.bench.precisions import BenchCase, environment, run_case

__all__ = ["BenchCase", "environment", "run_case"]
