"""sedd: inference for score-entropy discrete diffusion (SEDD) models of single cells."""

__version__ = "0.1.0"
