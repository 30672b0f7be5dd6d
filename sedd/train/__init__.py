"""Training: the JSON config and its data (``config``), the AMP/EMA loop (``trainer``)."""
