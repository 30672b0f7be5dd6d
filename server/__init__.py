"""The HTTP service over one ``sedd.engine.Engine``: ``server.app.create_app(settings)``."""
