"""Score networks: st3's single-cell transformers (``st3``), reference SEDD's DDiT (``ddit``)
and the layers they share (``layers``). The score-model protocol is ``sedd.precision.ScoreModel``
(the precision policy types its forward against it).
"""
