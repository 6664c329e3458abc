"""The ``fedroute`` command line: help on every command and option, plain text; ``--version``; run-config files."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import fedroute
from fedroute.cli import build_parser
from fedroute.cli.run_config import run_config_items

MARKUP = re.compile(r"``|:(mod|func|class|data|meth|attr):`")


def _parsers(parser: argparse.ArgumentParser, path: str = "fedroute"):
    """Every (sub)parser with its command path."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def test_every_command_and_option_has_plain_help() -> None:
    parsers = list(_parsers(build_parser()))
    assert {path for path, _ in parsers} >= {"fedroute", "fedroute flower", "fedroute deploy", "fedroute deploy local",
                                            "fedroute simulate", "fedroute reproduce", "fedroute monitor",
                                            "fedroute certificates"}
    for path, parser in parsers:
        assert parser.description, f"{path} has no description"
        text = parser.format_help()
        assert not MARKUP.search(text), f"{path} --help shows markup: {MARKUP.search(text).group(0)}"
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert all(choice.help for choice in action._choices_actions), path
            elif action.dest != "help":
                assert action.help, f"{path}: {action.option_strings or action.dest} has no help text"


def test_version_names_the_package_and_flower(repository: Path) -> None:
    completed = subprocess.run([sys.executable, "-m", "fedroute", "--version"], capture_output=True,
                               text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    with open(repository / "pyproject.toml", "rb") as stream:
        version = tomllib.load(stream)["project"]["version"]
    assert version == fedroute.__version__
    assert re.fullmatch(rf"fedroute {re.escape(version)} \(Flower 1\.42\.\d+, Python 3\.\d+\.\d+\)",
                        completed.stdout.strip()), completed.stdout


def test_run_config_files_and_items_merge_in_order(repository: Path) -> None:
    values = run_config_items([str(repository / "conf" / "linear.toml"), "num-server-rounds=3", "seed=5"])
    assert values["method"] == "greedy,exp3,fedcam" and values["init-spread"] == 32.0
    assert values["num-server-rounds"] == 3 and values["seed"] == 5  # the later items win
    with pytest.raises(ValueError, match="is not KEY=VALUE or a .toml file"):
        run_config_items(["conf/linear"])


def test_simulate_runs_a_conf_file_in_the_simulator(repository: Path, capsys: pytest.CaptureFixture) -> None:
    """The simulator's side of a conf file: `fedroute simulate --run-config conf/fig1.toml`."""
    from fedroute.cli import main

    assert main(["simulate", "--run-config", str(repository / "conf" / "fig1.toml"), "num-server-rounds=20",
                 "num-clients=4"]) == 0
    summaries = __import__("json").loads(capsys.readouterr().out)
    assert list(summaries) == ["greedy"] and summaries["greedy"]["rounds_with_two_routed"] == 0


@pytest.mark.parametrize("text", ["a=1 b=2", 'name="x y"', "name='x y' seed=\"5\" flag=true", "noise-std=0.5 k=-3",
                                  "path='/tmp/it\"s' on=false"])
def test_a_run_config_argument_splits_as_flwr_run_reads_it(text: str) -> None:
    """Flower's own parser of ``flwr run --run-config TEXT`` is the reference (it needs strings quoted)."""
    from flwr.common.config import parse_config_args

    assert run_config_items([text]) == parse_config_args([text])


def test_the_quoted_flower_form_is_several_items_and_a_quoted_value_one() -> None:
    quoted = run_config_items(["task=digit-rotations method=greedy"])
    assert quoted == run_config_items(["task=digit-rotations", "method=greedy"]) \
        == {"task": "digit-rotations", "method": "greedy"}
    assert run_config_items(['name="x y"', "seed=5"]) == {"name": "x y", "seed": 5}
    assert run_config_items(["seed=\"5\" rounds=5"]) == {"seed": "5", "rounds": 5}  # quoted: a string, as in flwr
    with pytest.raises(ValueError, match=r"--run-config item = 'name=\"x y' is invalid; .*no closing quotation"):
        run_config_items(['name="x y'])
    with pytest.raises(ValueError, match="'b' is not KEY=VALUE"):
        run_config_items(["a=1 b"])


def test_a_run_config_file_and_items_in_one_argument(repository: Path) -> None:
    values = run_config_items([f"{repository / 'conf' / 'linear.toml'} num-server-rounds=3"])
    assert values["method"] == "greedy,exp3,fedcam" and values["num-server-rounds"] == 3


def test_fedroute_flower_takes_the_quoted_run_config(repository: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fedroute flower --run-config "task=... method=..."`` reaches ``flwr run`` as separate keys."""
    import fedroute.deployment.launcher as launcher
    from fedroute.cli import main

    seen: dict = {}

    def fake_run(app_dir, overrides, num_supernodes, **options):
        seen.update(overrides)
        return type("Run", (), {"completed": True})()

    monkeypatch.setattr(launcher, "run_flower_app", fake_run)
    assert main(["flower", "--app-dir", str(repository), "--run-config",
                 "task=digit-rotations method=greedy num-clients=8"]) == 0
    assert (seen["task"], seen["method"], seen["num-clients"]) == ("digit-rotations", "greedy", 8)


def test_simulate_takes_several_items_in_one_argument(capsys: pytest.CaptureFixture) -> None:
    from fedroute.cli import main

    assert main(["simulate", "--method", "greedy", "--run-config", "num-server-rounds=6 num-clients=4"]) == 0
    summaries = __import__("json").loads(capsys.readouterr().out)
    assert list(summaries) == ["greedy"] and summaries["greedy"]["rounds"] == 6


def test_simulate_offers_every_routing_method_and_all() -> None:
    from fedroute.core.methods import METHODS
    from fedroute.server.run_config import EVERY_METHOD

    simulate = next(child for path, child in _parsers(build_parser()) if path == "fedroute simulate")
    (method,) = [action for action in simulate._actions if action.dest == "method"]
    assert method.default == EVERY_METHOD and tuple(method.choices) == (EVERY_METHOD, *METHODS)
