"""What a user asks for and how it becomes cells and engine jobs, for every front door.

``plan``: the one request type (``GenerationRequest``), its cell plan (``cell_plan``) and the
engine jobs that run it (``job_for``, ``jobs_for``), and imputation inputs as tokens;
``conditions``: the perturbation names a model is conditioned on, and files of them;
``imputation``: observed counts read from an ``.h5ad`` and matched to the model's genes;
``provenance``: what every output records about its request and model. The server, the Python
API, the CLI and shard jobs all build requests here; ``sedd.batch`` only runs them offline.
"""
