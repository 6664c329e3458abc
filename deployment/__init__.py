"""Deployment tooling around the Flower app: the launcher, a local federation, TLS material.

* :mod:`~fedroute.deployment.launcher`: :func:`run_flower_app`, ``flwr run`` in a hermetic local Ray
  simulation (``fedroute flower``);
* :mod:`~fedroute.deployment.local`: :class:`LocalFederation`, a real SuperLink and SuperNodes on
  127.0.0.1 (``fedroute deploy local``), with its runs (:mod:`~fedroute.deployment.control`) and faults
  (:mod:`~fedroute.deployment.faults`);
* :mod:`~fedroute.deployment.certificates`: :func:`make_certificates`, the private CA, SuperLink
  certificate and SuperNode keys (``fedroute certificates``);
* :mod:`~fedroute.deployment.flwr_config` (run configs as ``flwr run`` reads them) and
  :mod:`~fedroute.deployment.processes` (environment, ports, logs, stopping every process of a run).

None of it runs inside the ServerApp or the ClientApp (``fedroute.server``, ``fedroute.client``).  The
names above are resolved on first access: importing this package imports neither Flower nor
``cryptography``.
"""

import importlib as _importlib

__all__ = ["run_flower_app", "FlowerRun", "LocalFederation", "DeploymentRun", "CONNECTION", "make_certificates",
           "CertificateFiles", "resolve_run_config"]

_EXPORTS = {
    "run_flower_app": "fedroute.deployment.launcher",
    "FlowerRun": "fedroute.deployment.launcher",
    "LocalFederation": "fedroute.deployment.local",
    "DeploymentRun": "fedroute.deployment.control",
    "CONNECTION": "fedroute.deployment.control",
    "make_certificates": "fedroute.deployment.certificates",
    "CertificateFiles": "fedroute.deployment.certificates",
    "resolve_run_config": "fedroute.deployment.flwr_config",
}


def __getattr__(name: str) -> object:
    """Import a public name's module on first access (keeps ``import fedroute.deployment`` cheap)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedroute.deployment' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | {name for name in globals() if name.startswith("__")})
