"""The ``fedroute`` command line (:data:`DESCRIPTION` lists the commands; ``fedroute COMMAND --help``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from fedroute.simulation.workers import AUTO, resolve_workers

__all__ = ["main", "build_parser", "version_text", "DESCRIPTION"]


def _simulate(args: argparse.Namespace) -> int:
    from fedroute.server.run_config import parse_run_config
    from fedroute.simulation.recorded import check_simulable, simulate_run

    config = {"method": args.method, "task": "linear", "num-clients": args.num_clients, "init": args.init,
              "init-spread": args.init_spread, "seed": args.seed, "num-server-rounds": args.rounds}
    try:
        settings = parse_run_config({**config, **_run_config_items(args.run_config)})
        check_simulable(settings)
    except ValueError as error:
        print(f"fedroute: {error}", file=sys.stderr)
        return 2
    import logging

    from fedroute.monitoring.progress import ensure_console_handler

    ensure_console_handler(logging.getLogger("fedroute"))
    summaries = simulate_run(settings, Path(args.out) if args.out else None, progress=True)
    print(json.dumps(summaries, indent=2))
    return 0


def _run_config_items(items: list[str]) -> dict:
    """``KEY=VALUE`` items and run-config files (``conf/<experiment>.toml``) → run-config values, later items
    overriding earlier ones (``ValueError`` for an item that is neither)."""
    from fedroute.server.launcher import load_run_config_file, parse_config_value

    values = {}
    for item in items:
        if "=" not in item and item.endswith(".toml"):
            values.update(load_run_config_file(item))
            continue
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise ValueError(f"--run-config item {item!r} is not KEY=VALUE or a .toml file")
        values[key] = parse_config_value(value)
    return values


def _checked_overrides(args: argparse.Namespace) -> Optional[dict]:
    """The run-config overrides of ``flower`` / ``deploy local``, checked before anything starts (None: invalid,
    reported)."""
    from fedroute.server.launcher import app_config_defaults, resolve_run_config

    try:
        overrides = _run_config_items(args.run_config)
        keys = app_config_defaults(args.app_dir)
        # fedroute's app (or one with the same keys): one client per SuperNode, results where asked.
        if getattr(args, "supernodes", None) is None:  # fedroute flower: as many SuperNodes as clients
            explicit = overrides.get("num-clients")
            args.supernodes = explicit if isinstance(explicit, int) and not isinstance(explicit, bool) \
                and explicit > 0 else DEFAULT_SUPERNODES
        if "num-clients" in keys:
            overrides.setdefault("num-clients", args.supernodes)
        if "results-dir" in keys:
            overrides.setdefault("results-dir", str(Path(args.results_dir).resolve()))
        resolve_run_config(args.app_dir, overrides)
    except ValueError as error:
        print(f"fedroute: {error}", file=sys.stderr)
        return None
    return overrides


def _failure(kind: str, result) -> int:
    """Say why a run failed (the ServerApp's own error line if it logged one) and return exit code 1."""
    reasons = [line.split("fedroute: ", 1)[1].strip() for line in result.stdout.splitlines()
               if line.startswith("ERROR fedroute: ")]
    why = reasons[-1] if reasons else "see the ServerApp's traceback above"
    print(f"fedroute: the {kind} run failed (Flower status {result.status!r}): {why}", file=sys.stderr)
    return 1


def _reachable_ray_address(args: argparse.Namespace) -> bool:
    """``--ray-address`` absent, or a Ray head listens there (else the reason is printed)."""
    from fedroute.server.launcher import check_ray_address

    try:
        if args.ray_address is not None:
            check_ray_address(args.ray_address)
    except ValueError as error:
        print(f"fedroute: {error}", file=sys.stderr)
        return False
    return True


DEFAULT_SUPERNODES = 80
"""``fedroute flower``'s SuperNodes when neither ``--supernodes`` nor run-config ``num-clients`` says."""


def checked_num_gpus(value: float, gpu_count: Optional[Callable[[], int]] = None) -> Optional[str]:
    """Why ``--num-gpus value`` cannot work here (``None``: it can).

    Ray never starts a client that asks for a GPU share on a machine without one (the run would wait
    forever), so a share > 0 needs a GPU torch can see; ``gpu_count`` (default: torch's) counts them.
    """
    if not 0 <= value <= 64 or value != value:
        return f"--num-gpus {value:g} is invalid; allowed: a number in [0, 64] (GPUs per client, e.g. 0.25)"
    if value == 0:
        return None
    if gpu_count is None:
        def gpu_count() -> int:
            import torch

            return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpu_count() == 0:
        return (f"--num-gpus {value:g} asks Ray for a GPU share per client, but torch sees no GPU on this machine "
                "(Ray would never start the clients); leave --num-gpus at 0 (client-device auto runs on the CPU)")
    return None


def _flower(args: argparse.Namespace) -> int:
    from fedroute.server.launcher import run_flower_app

    if (overrides := _checked_overrides(args)) is None or not _reachable_ray_address(args):
        return 2
    if (problem := checked_num_gpus(args.num_gpus)) is not None:
        print(f"fedroute: {problem}", file=sys.stderr)
        return 2
    result = run_flower_app(args.app_dir, overrides, num_supernodes=args.supernodes, timeout=args.timeout, stream=True,
                            ray_address=args.ray_address, gpus_per_client=args.num_gpus)
    return 0 if result.completed else _failure("Flower", result)


def _deploy(args: argparse.Namespace) -> int:
    from fedroute.server.deploy import LocalFederation
    from fedroute.server.results import summary_table

    if (overrides := _checked_overrides(args)) is None:
        return 2
    with LocalFederation(args.app_dir, args.supernodes, tls=args.tls, state_dir=args.state_dir) as federation:
        result = federation.run(overrides, timeout=args.timeout, stream=True)
    if not result.completed:
        return _failure("deployed", result)
    if "results:" not in result.stdout and result.results_dir and (result.results_dir / "summary.json").is_file():
        print(summary_table(json.loads((result.results_dir / "summary.json").read_text())))  # stream lost it
    return 0


def _monitor(args: argparse.Namespace) -> int:
    from fedroute.monitoring.monitor import run_monitor

    return run_monitor(Path(args.run_dir), refresh=args.refresh, once=args.once, until_finished=args.until_finished,
                       method=args.method, plot=None if args.plot is None else Path(args.plot),
                       timeout=args.timeout)


def _certificates(args: argparse.Namespace) -> int:
    from fedroute.server.certificates import make_certificates

    try:
        files = make_certificates(args.out, days=args.days, sans=args.san, node_keys=args.node_keys,
                                  force=args.force, report=print)
    except ValueError as error:
        print(f"fedroute certificates: {error}", file=sys.stderr)
        return 2
    if files.node_keys:
        print("\nRegister the public keys with the SuperLink (it must run with --enable-supernode-auth):")
        for key in files.node_keys:
            print(f"  flwr supernode register {key}.pub <connection>")
    owned = " ".join(str(path) for path in (files.key, *files.node_keys))
    print("\nDocker on Linux: the Flower containers run as uid 49999 and the private keys are mode 600;\n"
          f"let the containers read the ones they mount with\n  sudo chown 49999:49999 {owned}")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    """``fedroute reproduce NAME|all``: run experiments (:mod:`fedroute.simulation.experiments.kit`); a claim that
    does not hold is a result (``claims.json``), not a failure: exit code 0."""
    import pandas as pd

    from fedroute.simulation.experiments import EXPERIMENTS, PAPER
    from fedroute.simulation.experiments.kit import InputError, peak_memory_mb, run_experiment
    from fedroute.simulation.results_doc import update_results_doc

    variant = getattr(args, "config", None) or PAPER
    if args.experiment == "all":
        if variant != PAPER:
            print("fedroute reproduce all: --config is invalid here; allowed: paper (all runs every variant)",
                  file=sys.stderr)
            return 2
        jobs = [(experiment, name) for experiment in EXPERIMENTS.values()
                for name in (PAPER, *(n for n, v in experiment.variants.items() if v.in_all))]
    else:
        experiment = EXPERIMENTS[args.experiment]
        if variant != PAPER and variant not in experiment.variants:
            print(f"fedroute reproduce {experiment.name}: --config {variant!r} is invalid; allowed: "
                  f"{', '.join([PAPER, *experiment.variants])}", file=sys.stderr)
            return 2
        jobs = [(experiment, variant)]
    try:
        configs = [experiment.configure(name, bool(args.quick), **experiment.arguments(args)) for experiment, name in jobs]
    except ValueError as error:
        print(f"fedroute reproduce {args.experiment}: {error}", file=sys.stderr)
        return 2
    try:
        asked = resolve_workers(args.workers, bool(args.quick))  # checked before anything runs
    except ValueError as error:
        print(f"fedroute reproduce: --{error}", file=sys.stderr)
        return 2
    if not _reachable_ray_address(args):
        return 2
    for (experiment, name), config in zip(jobs, configs):
        label = experiment.output_name(name)
        if not experiment.parallel and ((args.workers != AUTO and asked > 1) or args.ray_address):
            print(f"{experiment.name} is one vectorised process: --workers and --ray-address are ignored",
                  file=sys.stderr)
        print(f"reproduce {label}: {experiment.title}", flush=True)
        started, out = time.perf_counter(), Path(args.out) / label
        try:
            workers = resolve_workers(args.workers, bool(args.quick), experiment.auto_workers)
            results, claims = run_experiment(experiment, config, out, workers, args.ray_address, True)
        except InputError as error:
            print(f"fedroute reproduce {experiment.name}: {error}", file=sys.stderr)
            return 1
        with pd.option_context("display.width", 200, "display.max_columns", 40):
            for table in experiment.show(results):
                print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        for record in claims:
            print(f"[{ {True: 'holds', False: 'FAILS', None: 'untestable'}[record['holds']]}] {record['claim']}")
        print(f"{label}: {time.perf_counter() - started:.1f} s, peak memory {peak_memory_mb():.0f} MB; wrote {out}")
    docs = getattr(args, "docs", None) or (None if getattr(args, "quick", False) else _repository_results_doc())
    if args.experiment == "all" and docs is not None:
        updated = update_results_doc(Path(args.out), Path(docs), {e.name: e.show for e in EXPERIMENTS.values()})
        print(f"updated {len(updated)} marked tables of {docs}: {', '.join(updated)}")
    return 0


def _repository_results_doc() -> Optional[Path]:
    path = Path(__file__).resolve().parents[1] / "docs" / "results.md"
    return path if path.is_file() else None


DESCRIPTION = """\
fedroute: clustered federated learning on Flower that recovers from cluster collapse
(The Dynamics of Collapse and Recovery in Clustered Federated Learning).

  fedroute flower        run the Flower app (flwr run .) hermetically in a local Ray simulation
  fedroute deploy local  run it on a real SuperLink and SuperNodes on 127.0.0.1
  fedroute simulate      run one linear-task configuration in the batched simulator
  fedroute reproduce     run a paper experiment (tables, figures, claims)
  fedroute monitor       watch a run's routing (masses, starving clusters, arm mix, alarms) live
  fedroute certificates  make the TLS certificates and SuperNode keys of a deployment

Plain Flower works too: flwr run . (docs/quickstart.md)."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (:func:`_wrapped`), an option's default shown where it has a value."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, False, [], argparse.SUPPRESS) and action.option_strings \
                and "default" not in text:
            text += " (default: %(default)s)"
        return text


def _wrapped(text: str, width: int = 79) -> str:
    """``text`` with its prose lines filled to ``width``; indented lines (examples) kept as they are."""
    import textwrap

    return "\n".join(line if line.startswith(" ") or not line else textwrap.fill(line, width)
                     for line in text.splitlines())


def _command(commands: Any, name: str, summary: str, description: str = "") -> argparse.ArgumentParser:
    """A sub-command whose ``--help`` opens with ``summary`` (and ``description``)."""
    return commands.add_parser(name, help=summary, description=_wrapped(f"{summary}.\n\n{description}".strip()),
                               formatter_class=_HelpFormatter)


def version_text() -> str:
    """``fedroute --version``: fedroute's version, and Flower's and Python's."""
    import importlib.metadata
    import platform

    import fedroute

    try:
        flower = importlib.metadata.version("flwr")
    except importlib.metadata.PackageNotFoundError:
        flower = "not installed"
    return f"fedroute {fedroute.__version__} (Flower {flower}, Python {platform.python_version()})"


def _add_flower(commands: Any) -> None:
    flower = _command(commands, "flower", "run the Flower app in a local Ray simulation (flwr run, hermetic)",
                      "Runs flwr run APP-DIR with its own FLWR_HOME and ports, no per-run dependency install, one "
                      "client per simulated SuperNode (num-clients defaults to --supernodes), and checks the run's "
                      "real status with flwr ls (flwr run itself exits 0 when the ServerApp fails); the local "
                      "SuperLink is stopped afterwards. Exit code 0 iff the run completed.\n\nExamples:\n"
                      "  fedroute flower --run-config method=exp3 num-server-rounds=50\n"
                      "  fedroute flower --supernodes 80 --run-config conf/linear.toml")
    flower.add_argument("--app-dir", default=".", help="the Flower app (a directory with pyproject.toml)")
    flower.add_argument("--supernodes", type=int, default=None,
                        help="simulated SuperNodes, one client each (default: run-config num-clients if given, "
                             f"else {DEFAULT_SUPERNODES})")
    flower.add_argument("--num-gpus", type=float, default=0.0, metavar="SHARE",
                        help="GPUs per simulated client (Ray's client-resources-num-gpus; 0.25 = four clients per "
                             "GPU; needs a GPU torch can see); with run-config client-device = auto or cuda the "
                             "clients then compute on it (docs/datasets.md#gpus)")
    flower.add_argument("--results-dir", default="results", help="where <run-id>/ is written")
    flower.add_argument("--timeout", type=float, default=1800.0, help="seconds before the run is stopped")
    flower.add_argument("--run-config", nargs="*", default=[], metavar="KEY=VALUE|FILE.toml",
                        help="run-config overrides (keys of [tool.flwr.app.config]) and run-config files such as "
                             "conf/linear.toml; later items override earlier ones")
    flower.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                        help="run the simulation on this existing Ray cluster (its head's address, as ray start "
                             "--head prints it) instead of a private local Ray (docs/performance.md)")
    flower.set_defaults(handler=_flower)


def _add_deploy(commands: Any) -> None:
    deploy = _command(commands, "deploy", "run the Flower app on real SuperLink and SuperNode processes",
                      "docs/deployment.md has the commands for other machines and Docker Compose.")
    local = _command(deploy.add_subparsers(dest="action", required=True, metavar="{local}"), "local",
                     "a SuperLink and N SuperNodes on 127.0.0.1",
                     "Starts flower-superlink and N flower-supernode processes (SuperNode i with node config "
                     "partition-id=i num-partitions=N), runs the app on them with flwr run, checks its status with "
                     "flwr ls and stops every process it started. Exit code 0 iff the run completed.")
    local.add_argument("--supernodes", type=int, required=True, help="SuperNodes to start, one client each")
    local.add_argument("--tls", action="store_true", help="TLS with a private CA made for this deployment")
    local.add_argument("--run-config", nargs="*", default=[], metavar="KEY=VALUE|FILE.toml",
                       help="run-config overrides and run-config files, as for fedroute flower")
    local.add_argument("--results-dir", default="results", help="where <run-id>/ is written")
    local.add_argument("--state-dir", default=None,
                       help="persistent client state: SuperNode i gets node config state-dir=STATE_DIR/supernode-i")
    local.add_argument("--timeout", type=float, default=3600.0, help="seconds before the run is stopped")
    local.add_argument("--app-dir", default=".", help="the Flower app (a directory with pyproject.toml)")
    local.set_defaults(handler=_deploy)


def _add_certificates(commands: Any) -> None:
    certificates = _command(
        commands, "certificates", "make TLS certificates (private CA + SuperLink) and SuperNode key pairs",
        "Makes a private CA (ca.key, ca.crt), the SuperLink certificate (server.key, server.pem; SAN DNS:superlink, "
        "DNS:localhost, IP:127.0.0.1 and every --san) and, with --node-keys N, N SuperNode key pairs in OpenSSH "
        "format (supernode-keys/supernode-<i>{,.pub}). Existing files are kept unless --force. Needs no openssl or "
        "ssh-keygen (docs/deployment.md).")
    certificates.add_argument("--out", default="certificates", help="output directory")
    certificates.add_argument("--days", type=int, default=365, help="validity of new certificates in days")
    certificates.add_argument("--san", action="append", default=[], metavar="DNS:name|IP:address",
                              help="an extra subject alternative name of the SuperLink (repeatable)")
    certificates.add_argument("--node-keys", type=int, default=0, metavar="N", help="SuperNode key pairs to make")
    certificates.add_argument("--force", action="store_true", help="remake the CA and the server certificate")
    certificates.set_defaults(handler=_certificates)


def _add_simulate(commands: Any) -> None:
    sim = _command(commands, "simulate", "one linear-task configuration in the batched simulator",
                   "Runs the same dynamics as the Flower app (the same random draws: identical routes) in one "
                   "process, in well under a second, and prints every method's summary as JSON.")
    sim.add_argument("--method", default="all", choices=("all", "greedy", "exp3", "sync-entry", "fedcam"),
                     help="the routing method; all runs Greedy IFCA, EXP3, synchronized entry and FedCAM in turn")
    sim.add_argument("--rounds", type=int, default=100, help="training rounds T (run-config num-server-rounds)")
    sim.add_argument("--num-clients", type=int, default=80, help="clients of the two-group linear task")
    sim.add_argument("--init", default="collapsed", choices=("collapsed", "spread", "copies"),
                     help="the cluster models' start: collapsed (in the starvation basin), spread (theta_bar + "
                          "rho z) or copies (K identical copies)")
    sim.add_argument("--init-spread", type=float, default=3.0, help="rho of the spread start")
    sim.add_argument("--seed", type=int, default=0, help="data, start and routing seed")
    sim.add_argument("--run-config", nargs="*", default=[], metavar="KEY=VALUE|FILE.toml",
                     help="further run-config keys, as for fedroute flower (e.g. starvation-rounds=5)")
    sim.add_argument("--out", default=None, help="write a run directory here (telemetry, alarms, summary.json) "
                     "that fedroute monitor reads")
    sim.set_defaults(handler=_simulate)


def _add_monitor(commands: Any) -> None:
    monitor = _command(commands, "monitor", "watch a running or finished run (masses, starvation, arms, alarms)",
                       "Live terminal view of results/<run-id>/ (or a simulate --out directory): per-cluster mass "
                       "bars, rounds since each cluster was last routed, the EXP3 arm mix, the routed loss and the "
                       "alarms, refreshed as rounds land.")
    monitor.add_argument("run_dir", help="the run's results directory (results/<run-id>)")
    monitor.add_argument("--refresh", type=float, default=1.0, help="seconds between refreshes")
    monitor.add_argument("--once", action="store_true", help="print one view and exit")
    monitor.add_argument("--until-finished", action="store_true",
                         help="exit when the run has finished (status.json), instead of on Ctrl-C")
    monitor.add_argument("--method", default=None, help="show only this method (default: all)")
    monitor.add_argument("--plot", default=None, metavar="FILE",
                         help="write masses and routed loss over rounds to FILE (.png, .pdf; no suffix: both) "
                         "and exit")
    monitor.add_argument("--timeout", type=float, default=None, help="stop following after this many seconds")
    monitor.set_defaults(handler=_monitor)


def _add_reproduce(commands: Any) -> None:
    from fedroute.simulation.experiments import EXPERIMENTS, PAPER

    reproduce = _command(commands, "reproduce", "a paper experiment: tables, figures, claims",
                         "Runs an experiment (docs/experiments.md) in the batched simulator and writes its tables, "
                         "figures, claims.json and config.json into OUT/<experiment>[-<config>]; all runs every "
                         "experiment and named configuration and rewrites the marked tables of docs/results.md. "
                         "The Flower path of each experiment is conf/<experiment>.toml (flwr run . --run-config "
                         "conf/<experiment>.toml).")
    reproduce.add_argument("experiment", choices=[*sorted(EXPERIMENTS), "all"], help="the experiment, or all")
    reproduce.add_argument("--out", default="results/reproduce", help="output directory")
    reproduce.add_argument("--quick", action="store_true", help="a small version (for tests)")
    named = "; ".join(f"{name}: " + ", ".join(f"{key} ({variant.description})" for key, variant in e.variants.items())
                      for name, e in sorted(EXPERIMENTS.items()) if e.variants)
    reproduce.add_argument("--config", default=PAPER, metavar="NAME",
                           help=f"a named configuration ({PAPER}: the paper's; others are written to "
                                f"OUT/<experiment>-<name>)" + (f"; {named}" if named else ""))
    reproduce.add_argument("--workers", default=AUTO, metavar="N", help="processes running chunks of runs (results "
                           "do not depend on it); auto: the CPUs this process may use (1 with --quick, "
                           "and for gmm, whose chunks share cached fits)")
    reproduce.add_argument("--ray-address", default=None, metavar="HOST:PORT",
                           help="run the chunks as tasks of this existing Ray cluster")
    reproduce.add_argument("--data-file", default=None, help="housing: local copy of the California Housing table "
                           "(csv, csv.gz, parquet); default $FEDROUTE_HOUSING_FILE, else the real download, "
                           "else (offline) the copy shipped with fedroute")
    reproduce.add_argument("--docs", default=None, metavar="FILE", help="all: the results document whose marked "
                           "tables are rewritten (default: the repository's docs/results.md, not with --quick)")
    reproduce.set_defaults(handler=_reproduce)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fedroute``."""
    parser = argparse.ArgumentParser(prog="fedroute", description=DESCRIPTION, formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=version_text(),
                        help="print fedroute's version (and Flower's and Python's) and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_flower, _add_deploy, _add_certificates, _add_simulate, _add_monitor, _add_reproduce):
        add(commands)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``fedroute`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    # Under ``python -m`` this file runs as ``__main__``; use the registry of the real module.
    from fedroute.simulation.cli import main as package_main

    sys.exit(package_main())
