"""DCM's release names its unconditional script `scripts/infernce_generation.py` (sic); this is
the same drop-in as `scripts/inference_generation.py`: the same flags, files and behaviour.
"""

from sedd.commands.st3_scripts import inference_generation
from sedd.commands.st3_words import script_main

if __name__ == "__main__":
    script_main(inference_generation)
