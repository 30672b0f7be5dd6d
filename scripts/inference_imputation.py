"""st3-compatible `scripts/inference_imputation.py`: hide a fraction of real cells' counts, impute
them and score the imputation, writing st3's `imputation_results/` files.

A thin wrapper: flags and outputs are described in ``sedd.commands.st3_imputation``; sampling is
the engine's imputation path, the one `sedd impute` uses. ``--help`` lists the flags.
"""

from sedd.commands.st3_imputation import inference_imputation
from sedd.commands.st3_words import script_main

if __name__ == "__main__":
    script_main(inference_imputation)
