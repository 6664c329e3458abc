"""Batched simulator, experiment configs and metrics (the ``fedroute`` CLI is :mod:`fedroute.cli`)."""
