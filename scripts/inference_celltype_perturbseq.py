"""st3-compatible `celltype_cond/scripts/inference_celltype_perturbseq.py`: perturbed cells of one
cell type, into `<experiment_dir>/inference_results/celltype_<name>/`.

A thin wrapper: flags and outputs are described in ``sedd.commands.st3_celltype``; sampling is
the engine every other entry point uses. ``--help`` lists the flags.
"""

from sedd.commands.st3_celltype import celltype_main

if __name__ == "__main__":
    celltype_main()
