"""The diffusion itself, diffusers-style: transition graphs (``graph``), noise schedules
(``noise``), the time grid (``schedule``), the reverse step (``sampling``: ``Sampler``, with what a
step takes per row in ``step_rows``), the fp64 categorical draw (``categorical``), counter-based
randomness (``randomness``) and CUDA graphs of the block step (``cuda_graphs``).
"""
