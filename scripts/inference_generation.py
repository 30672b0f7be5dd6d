"""st3-compatible `scripts/inference_generation.py`: Generate cells from an unconditional model.

A thin wrapper: flags and outputs are described in ``sedd.commands.st3_scripts``; sampling is
``sedd.run.run_plan``, the loop every other entry point uses. ``--help`` lists the flags.
"""

from sedd.commands.st3_scripts import inference_generation
from sedd.commands.st3_words import script_main

if __name__ == "__main__":
    script_main(inference_generation)
