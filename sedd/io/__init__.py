"""Files in and out: AnnData read (``read``) and written (``write``), counts <-> tokens
(``tokens``), and atomic files, JSON and hashes (``files``).
"""
