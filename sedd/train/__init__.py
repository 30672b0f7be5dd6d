"""Training: the JSON config and its data (``config``), the masked-diffusion objective
(``objective``), the EMA and the saved run state (``state``), the AMP training loop (``trainer``).
"""
