"""Offline jobs built on the engine: requests and cell plans, runs, shards, their manifest, merge.

``requests`` turns what a user asks for into a cell plan and engine jobs; ``run`` drives them
through an in-process engine batch by batch; ``shards``/``manifest``/``shard_job`` make a run
resumable and splittable over a SLURM array; ``merge`` joins the shards after checking them.
"""
