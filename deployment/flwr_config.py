"""Run configs as ``flwr run`` reads them: ``--run-config`` text and files, the app's ``[tool.flwr.app.config]``.

Every command that starts the app checks its run config here first (:func:`resolve_run_config`): an invalid
key or value is reported before any process starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

__all__ = ["FEDROUTE_SERVERAPP", "FEDROUTE_SERVERAPPS", "parse_config_value", "format_run_config",
           "app_config_defaults", "resolve_run_config", "load_run_config_file"]

FEDROUTE_SERVERAPP = "fedroute.server.app:app"
"""fedroute's ServerApp as an installed package's component (plugin apps, tests)."""
FEDROUTE_SERVERAPPS = (FEDROUTE_SERVERAPP, "fedroute_app:serverapp")
"""The ServerApp components whose run config :func:`resolve_run_config` validates in full (the second is
this repository's own, run from the app's files: ``fedroute_app.py``)."""


def parse_config_value(text: str) -> Any:
    """A command-line run-config value: int, float, bool, else string."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip('"').strip("'")


def format_run_config(values: Mapping[str, Any]) -> str:
    """``--run-config`` text: strings double-quoted, booleans ``true``/``false``."""
    parts = []
    for key, value in values.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        else:
            text = str(value)
            if "\n" in text or ('"' in text and "'" in text):
                raise ValueError(f"run-config '{key}' = {text!r}: a string may not hold a newline or both quote kinds")
            # flwr accepts "..." or '...' without escapes: single quotes keep backslashes literal.
            text = f'"{text}"' if "'" in text else f"'{text}'"
        parts.append(f"{key}={text}")
    return " ".join(parts)


def _flower_app_table(app_dir: str | Path) -> dict[str, Any]:
    """``[tool.flwr.app]`` of the app's ``pyproject.toml`` (``ValueError`` if there is none)."""
    import tomllib

    pyproject = Path(app_dir) / "pyproject.toml"
    if not pyproject.is_file():
        raise ValueError(f"{Path(app_dir).resolve()} is not a Flower app: it has no pyproject.toml")
    with open(pyproject, "rb") as stream:
        return dict(tomllib.load(stream).get("tool", {}).get("flwr", {}).get("app", {}))


def app_config_defaults(app_dir: str | Path) -> dict[str, Any]:
    """The app's run-config keys and defaults (``[tool.flwr.app.config]``, flattened as Flower does)."""
    from flwr.common.config import flatten_dict

    return dict(flatten_dict(_flower_app_table(app_dir).get("config", {})))


def resolve_run_config(app_dir: str | Path, run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The run config the ServerApp will see, checked before anything starts.

    The overrides go through Flower's own parsing (``--run-config`` text →
    values) and are fused with the app's ``[tool.flwr.app.config]``, as
    ``flwr run`` does.  For fedroute's ServerApp the result is validated with
    :func:`~fedroute.server.run_config.parse_run_config`.

    Raises
    ------
    ValueError
        For a key the app does not define (naming the allowed keys), or a value
        ``parse_run_config`` rejects (naming the key and the allowed values).
    """
    from flwr.common.config import fuse_dicts, parse_config_args

    pyproject = Path(app_dir) / "pyproject.toml"
    app = _flower_app_table(app_dir)
    defaults = app_config_defaults(app_dir)
    unknown = sorted(set(run_config) - set(defaults))
    if unknown:
        raise ValueError(f"run-config key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                         f"{'are' if len(unknown) > 1 else 'is'} not defined by the app in {pyproject}; "
                         f"allowed keys: {', '.join(sorted(defaults))}")
    overrides = parse_config_args([format_run_config(run_config)]) if run_config else {}
    resolved = fuse_dicts(defaults, overrides)
    if app.get("components", {}).get("serverapp") in FEDROUTE_SERVERAPPS:
        from fedroute.server.run_config import parse_run_config

        parse_run_config(resolved)
    return resolved


def load_run_config_file(path: str | Path) -> dict[str, Any]:
    """The overrides of a run-config file (``conf/<experiment>.toml``), read as ``flwr run --run-config FILE`` does.

    Raises
    ------
    ValueError
        For a path that is not an existing ``.toml`` file, or TOML that does not parse (naming the file).
    """
    from flwr.common.config import parse_config_args

    path = Path(path)
    if path.suffix != ".toml" or not path.is_file():
        raise ValueError(f"run-config file {str(path)!r} is not an existing .toml file")
    try:
        return parse_config_args([str(path)])
    except Exception as error:  # tomli.TOMLDecodeError, UnicodeDecodeError
        raise ValueError(f"run-config file {str(path)!r} does not parse: {error}") from None
