"""st3's `scripts/inference_generation2.py` (the `--data_path` comparison version, on st3's
mismatch branches): the same drop-in as `scripts/inference_generation.py`, whose flag table
covers both versions (their comparison-only flags are accepted and noted).
"""

from sedd.commands.st3_scripts import inference_generation
from sedd.commands.st3_words import script_main

if __name__ == "__main__":
    script_main(inference_generation)
