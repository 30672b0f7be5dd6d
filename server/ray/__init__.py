"""``sedd serve --replicas N``: the app as a Ray Serve deployment (``replicas``), and what runs
in Ray's HTTP proxy (``proxy_errors``, ``proxy_http``). Only ``--replicas`` imports this."""
