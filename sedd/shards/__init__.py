"""Runs split over many processes: which cells a shard takes, resuming, merging.

``ranges`` says which cells shard k of n generates (by default from the SLURM array);
``manifest`` records the request a directory's shards belong to (``request.json``) and checks it;
``job`` runs or resumes one shard through the offline driver (``sedd.run.run_plan``), saving
finished batches so a killed task loses none; ``merge`` joins the shards after checking them.
"""
