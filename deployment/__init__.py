"""Deployment tooling around the Flower app: the launcher, a local federation, TLS material.

* :mod:`~fedroute.deployment.launcher`: :func:`run_flower_app`, ``flwr run`` in a hermetic local Ray
  simulation (``fedroute flower``);
* :mod:`~fedroute.deployment.local`: :class:`LocalFederation`, a real SuperLink and SuperNodes on
  127.0.0.1 (``fedroute deploy local``), with its runs (:mod:`~fedroute.deployment.control`) and faults
  (:mod:`~fedroute.deployment.faults`);
* :mod:`~fedroute.deployment.certificates`: :func:`make_certificates`, the private CA, SuperLink
  certificate and SuperNode keys (``fedroute certificates``);
* :mod:`~fedroute.deployment.flwr_config` (run configs as ``flwr run`` reads them),
  :mod:`~fedroute.deployment.processes` (environment, ports, logs, stopping every process of a run) and
  :mod:`~fedroute.deployment.control_api` (a SuperLink's runs and nodes, queried from this process).

None of it runs inside the ServerApp or the ClientApp (``fedroute.server``, ``fedroute.client``).
Import a name from its module (``from fedroute.deployment.local import LocalFederation``): this package
itself imports nothing, so the light modules stay light (no ``cryptography`` for the launcher).
"""
