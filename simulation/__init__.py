"""Batched simulator, experiment configs, metrics and the ``fedroute`` CLI."""
