"""Evaluation: real-vs-generated metrics (``metrics``, built from ``gene_metrics`` and
``distances``), their plots, st3-style scoring, the precision report."""
