"""What the ClientApp imports: in deployment every message starts a fresh ClientApp process, which pays for it."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "pandas", "matplotlib", "sklearn", "scipy", "ray", "pyarrow", "tqdm")
TASK_MODULES = ("linear", "gmm", "housing", "characters", "femnist")


def _modules_after(code: str) -> set[str]:
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    listing = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    return set(json.loads(listing.stdout.strip().splitlines()[-1]))


def test_the_clientapp_imports_no_heavy_library_and_no_task_until_a_message_names_one() -> None:
    loaded = _modules_after("import fedroute.client.app")
    assert not {name for name in loaded if name.split(".")[0] in HEAVY}
    assert not {f"fedroute.tasks.{task}" for task in TASK_MODULES} & loaded
    assert not {"fedroute.strategies.clustered", "fedroute.monitoring.recorder"} & loaded  # server side
    linear = _modules_after("from fedroute.tasks.registry import task_from_config\n"
                            "task_from_config({'task': 'linear', 'num-clients': 4})")
    assert "fedroute.tasks.linear" in linear
    assert not {f"fedroute.tasks.{task}" for task in TASK_MODULES if task != "linear"} & linear
    assert not {name for name in linear if name.split(".")[0] in HEAVY}


def test_the_command_line_imports_neither_flower_nor_torch_nor_the_deployment_tooling_for_its_help() -> None:
    """``fedroute --help`` (and building the parser every command starts from) stays light: each command
    imports what it runs when it runs."""
    loaded = _modules_after("from fedroute.cli import build_parser\nbuild_parser().format_help()")
    assert "fedroute.cli.parser" in loaded
    assert not {name for name in loaded if name.split(".")[0] in ("torch", "flwr", "ray", "cryptography", "grpc")}
    assert not {name for name in loaded if name.startswith(("fedroute.deployment.", "fedroute.simulation.recorded"))}
