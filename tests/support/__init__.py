"""Helpers shared by the test modules (no test module imports another test module).

- :mod:`support.app_config` — the repository's Flower app and its run config
  (``[tool.flwr.app.config]`` of ``pyproject.toml``, read in one place);
- :mod:`support.grid` — an in-process Flower ``Grid`` (:class:`~support.grid.InProcessGrid`),
  the ServerApp's ``main`` on it, and the task identity Flower stamps messages with;
- :mod:`support.linear_app` — a user's torch ClientApp for the linear task (the plugin API);
- :mod:`support.replies` — crafted training replies and a strategy to receive them;
- :mod:`support.deployment` — waiting on and reading a real SuperLink/SuperNode deployment;
- :mod:`support.telemetry` — the rounds/clients tables of two runtimes compared.

Fixtures built on these live in ``tests/conftest.py``.  ``tests/`` is on ``sys.path``
while pytest runs (its rootdir-relative import mode), so modules import ``support.x``.
"""
