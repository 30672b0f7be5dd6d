"""Generic HTTP hardening, below the app: the connection protocol (``protocol``), the gate before
routing (``guard``), bounded and strictly parsed request bodies (``limits``, ``jsonbody``) and the
one writer of error bodies (``errors``). Nothing here imports the app's own modules."""
