"""What a user asks for and how it becomes cells and engine jobs, for every front door.

``plan``: the one request type (``GenerationRequest``, holding a ``SamplingOptions``) and the one
planning call (``plan`` -> ``Plan``: the cells, numbered once, and the engine jobs that run them);
``imputation``: observed counts (an ``.h5ad`` or lists) matched to the model's genes, as tokens;
``conditions``: the perturbation names a model is conditioned on, and files of them;
``provenance``: what every output records about its request and model. The server, the Python
API, the CLI and shard jobs all build requests here; ``sedd.shards`` only runs them offline.
"""
