"""Thin routers: health, model card, metrics, sampling."""
