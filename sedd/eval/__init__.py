"""Evaluation: real-vs-generated metrics, their plots, st3-style scoring, the precision report."""
