"""Files in and out: AnnData read (``read``) and written (``write``), counts <-> tokens
(``tokens``), atomic files, JSON and hashes (``files``), and YAML configs read within bounds
(``yaml_files``).
"""
