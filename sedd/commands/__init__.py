"""One module per ``sedd`` sub-command; each exposes ``register(subparsers)``."""
