#!/usr/bin/env python3
"""Write fedroute's Docker Compose files for N SuperNodes (Flower 1.42).

    python3 scripts/compose-scale.py N > docker-compose.generated.yml
    python3 scripts/compose-scale.py N --tls > docker-compose.tls.generated.yml
    python3 scripts/compose-scale.py N --tls --no-node-auth > docker-compose.tls.generated.yml

The committed ``docker-compose.yml`` and ``docker-compose.tls.yml`` are this
script's output for N = 4 (a test keeps them equal).  The base file holds one
SuperLink, one ServerApp executor (``superexec-serverapp``), SuperNodes
``supernode-0 … supernode-{N-1}`` (node config ``partition-id=i
num-partitions=N``, Runtime API port ``9094 + i``) and one ClientApp executor
``superexec-clientapp-i`` per SuperNode.  State that must survive a restart is
on named volumes: the SuperLink's database (``superlink-state``), the
strategy's checkpoints (``checkpoints``), each client's controller state
(``client-state-i``) and the results (``results``).  Every container drops all
capabilities, runs with ``no-new-privileges`` and a memory limit
(``SUPERLINK_MEMORY``, ``SERVERAPP_MEMORY``, ``SUPERNODE_MEMORY``,
``CLIENTAPP_MEMORY``).  ``--tls`` writes the override that swaps ``--insecure``
for certificates made by ``scripts/make-certificates.sh`` and enables SuperNode
authentication (``--no-node-auth``: TLS only, for development).

Standard library only; the output is plain YAML text (no PyYAML needed).
"""

from __future__ import annotations

import argparse
import sys

FLWR_VERSION = "${FLWR_VERSION:-1.42.0}"
SUPERLINK_PORT = 8000
FIRST_SUPERNODE_PORT = 9094
MAX_SUPERNODES = 65535 - FIRST_SUPERNODE_PORT + 1
CERTIFICATES = "/app/certificates"
SUPERLINK_DATABASE = "/app/superlink.db"
CLIENT_STATE = "/app/state"
CHECKPOINTS = "/app/checkpoints"
HOUSING_TABLE = "/app/data/california_housing.csv.gz"
"""Where the executors find the California Housing table (the FAB does not carry it)."""
MEMORY = {"superlink": ("SUPERLINK_MEMORY", "1g"), "serverapp": ("SERVERAPP_MEMORY", "2g"),
          "supernode": ("SUPERNODE_MEMORY", "512m"), "clientapp": ("CLIENTAPP_MEMORY", "2g")}
"""Memory limit per kind of container: (environment variable, default)."""

__all__ = ["base_compose", "tls_override", "supernode_port", "main"]


def supernode_port(index: int) -> int:
    """Runtime API port of ``supernode-<index>`` (the ClientApp executor connects to it)."""
    return FIRST_SUPERNODE_PORT + index


def _healthcheck(port: int) -> str:
    return f"""    healthcheck:
      test: ["CMD", "python", "-c", "import socket; socket.create_connection(('127.0.0.1', {port}), 2).close()"]
      interval: 5s
      timeout: 5s
      retries: 24
      start_period: 5s
"""


def _confined(kind: str) -> str:
    """No capabilities, no privilege escalation, a memory limit (settable per kind of container)."""
    variable, default = MEMORY[kind]
    return f"""    cap_drop:
      - ALL
    security_opt:
      - no-new-privileges:true
    mem_limit: ${{{variable}:-{default}}}
"""


def _command(arguments: list[str], indent: str = "      ") -> str:
    lines = []
    for argument in arguments:
        needs_quotes = argument.isdigit() or " " in argument or argument.startswith(("*", "&", "!"))
        lines.append(f'{indent}- "{argument}"' if needs_quotes else f"{indent}- {argument}")
    return "\n".join(lines) + "\n"


def _superlink_arguments(tls: bool, node_auth: bool) -> list[str]:
    arguments = [] if tls else ["--insecure"]
    arguments += ["--isolation", "process", "--host", "0.0.0.0", "--port", str(SUPERLINK_PORT),
                  "--disable-runtime-dependency-installation", "--database", SUPERLINK_DATABASE]
    if tls:
        arguments += ["--ssl-ca-certfile", f"{CERTIFICATES}/ca.crt",
                      "--ssl-certfile", f"{CERTIFICATES}/server.pem",
                      "--ssl-keyfile", f"{CERTIFICATES}/server.key"]
    if node_auth:
        arguments += ["--enable-supernode-auth"]
    return arguments


def _serverapp_arguments(tls: bool) -> list[str]:
    security = ["--root-certificates", f"{CERTIFICATES}/ca.crt"] if tls else ["--insecure"]
    return security + ["--runtime-api-address", f"superlink:{SUPERLINK_PORT}"]


def _supernode_arguments(index: int, count: int, tls: bool, node_auth: bool) -> list[str]:
    security = ["--root-certificates", f"{CERTIFICATES}/ca.crt"] if tls else ["--insecure"]
    arguments = security + [
        "--superlink", f"superlink:{SUPERLINK_PORT}",
        "--isolation", "process",
        "--host", "0.0.0.0",
        "--port", str(supernode_port(index)),
        "--node-config", f"partition-id={index} num-partitions={count} state-dir='{CLIENT_STATE}'",
    ]
    if node_auth:
        arguments += ["--auth-supernode-private-key", f"{CERTIFICATES}/supernode-keys/supernode-{index}"]
    return arguments


def _clientapp_arguments(index: int) -> list[str]:
    # The SuperNode's Runtime API stays plain HTTP on the compose network in both
    # files (it is not published); see docs/deployment.md, "What TLS covers".
    return ["--insecure", "--runtime-api-address", f"supernode-{index}:{supernode_port(index)}"]


def _housing_mount() -> str:
    """The repository's copy of the California Housing table, read-only, where ``FEDROUTE_HOUSING_FILE`` says."""
    return f"      - ./tasks/data/california_housing.csv.gz:{HOUSING_TABLE}:ro\n"


def _check_count(count: int) -> None:
    if not 1 <= count <= MAX_SUPERNODES:
        raise ValueError(f"N must be between 1 and {MAX_SUPERNODES}, got {count}")


def _supernode_services(index: int, count: int) -> str:
    """``supernode-<index>`` and its ClientApp executor ``superexec-clientapp-<index>``."""
    port = supernode_port(index)
    return "".join([f"""\

  supernode-{index}:
    image: flwr/supernode:{FLWR_VERSION}
    command:
""", _command(_supernode_arguments(index, count, tls=False, node_auth=False)), """\
    environment: *flower-environment
""", _healthcheck(port), _confined("supernode"), f"""\
    depends_on:
      superlink:
        condition: service_healthy

  # Runs the ClientApp (fedroute_app:clientapp, from the run's FAB) for supernode-{index}.
  superexec-clientapp-{index}:
    build: *superexec-build
    image: fedroute-superexec:{FLWR_VERSION}
    command:
""", _command(_clientapp_arguments(index)), f"""\
    environment: *executor-environment
    volumes:
      # This client's controller state (node config state-dir): survives a restart.
      - client-state-{index}:{CLIENT_STATE}
{_housing_mount()}""", _confined("clientapp"), f"""\
    stop_signal: SIGINT
    restart: on-failure:3
    depends_on:
      supernode-{index}:
        condition: service_healthy
"""])


def base_compose(count: int) -> str:
    """The base compose file for ``count`` SuperNodes (insecure: no TLS)."""
    _check_count(count)
    out = [f"""\
# fedroute on Flower 1.42 with Docker Compose: one SuperLink, one ServerApp
# executor, N = {count} SuperNodes and one ClientApp executor per SuperNode.
# Generated by `python3 scripts/compose-scale.py {count}`: to change the structure,
# edit the generator and regenerate.  Commands and scaling: docs/deployment.md.
#
# Without TLS (development only: anyone who reaches port 8000 controls the
# federation).  With TLS and SuperNode authentication: docs/deployment.md.

x-flower-environment: &flower-environment
  FLWR_TELEMETRY_ENABLED: "0"
  FLWR_DISABLE_UPDATE_CHECK: "1"
  # No per-run `uv sync` of the app's dependencies (it would pull a CUDA torch):
  # the executor image has them installed (docker/Dockerfile.superexec).  The
  # app's code itself comes with every run, in its FAB (`flwr run . <connection>`).
  FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION: "1"

x-executor-environment: &executor-environment
  <<: *flower-environment
  # The housing task's table: Flower's FAB builder drops .csv.gz files.
  FEDROUTE_HOUSING_FILE: {HOUSING_TABLE}

x-superexec-build: &superexec-build
  context: .
  dockerfile: docker/Dockerfile.superexec
  args:
    FLWR_VERSION: {FLWR_VERSION}

services:
  superlink:
    image: flwr/superlink:{FLWR_VERSION}
    command:
""", _command(_superlink_arguments(tls=False, node_auth=False)), f"""\
    environment: *flower-environment
    ports:
      # Fleet, Control and Runtime APIs all share this port in Flower 1.42.
      - "${{SUPERLINK_BIND:-127.0.0.1}}:{SUPERLINK_PORT}:{SUPERLINK_PORT}"
    volumes:
      # The SuperLink's state (nodes, runs): a restarted SuperLink knows its SuperNodes.
      # Mounted on the image's /app (owned by the container's user, uid 49999).
      - superlink-state:/app
""", _healthcheck(SUPERLINK_PORT), _confined("superlink"), f"""\

  # Runs the ServerApp (fedroute_app:serverapp, from the run's FAB) of every run.
  superexec-serverapp:
    build: *superexec-build
    image: fedroute-superexec:{FLWR_VERSION}
    command:
""", _command(_serverapp_arguments(tls=False)), f"""\
    environment:
      <<: *executor-environment
      # The ServerApp writes <results-dir>/<run-id>/; a relative results-dir
      # (default "results") resolves here, i.e. in the `results` volume.
      FEDROUTE_RESULTS_ROOT: /app
      # checkpoint-dir = "" checkpoints here (one directory per configuration).
      FEDROUTE_CHECKPOINT_DIR: {CHECKPOINTS}
    volumes:
      - results:/app/results
      - checkpoints:{CHECKPOINTS}
{_housing_mount()}""", _confined("serverapp"), """\
    restart: on-failure:3
    depends_on:
      superlink:
        condition: service_healthy
"""]
    out += [_supernode_services(index, count) for index in range(count)]
    out.append("\nvolumes:\n  results:\n  checkpoints:\n  superlink-state:\n")
    out += [f"  client-state-{index}:\n" for index in range(count)]
    return "".join(out)


def _mount(name: str) -> str:
    return f"      - ./certificates/{name}:{CERTIFICATES}/{name}:ro\n"


def tls_override(count: int, node_auth: bool = True) -> str:
    """The TLS override for ``count`` SuperNodes, with SuperNode authentication unless ``node_auth=False``."""
    _check_count(count)
    auth_note = ("# SuperNode authentication: only SuperNodes whose public key was registered\n"
                 "# (`flwr supernode register`) can connect; register the keys before the\n"
                 "# SuperNodes start (docs/deployment.md, \"SuperNode authentication\").\n"
                 if node_auth else "# Without SuperNode authentication (development only).\n")
    flags = " --tls" if node_auth else " --tls --no-node-auth"
    keys = f" --node-keys {count}" if node_auth else ""
    out = [f"""\
# TLS override for docker-compose.yml (N = {count} SuperNodes):
#   scripts/make-certificates.sh{keys}   # CA, SuperLink certificate{", SuperNode keys" if node_auth else ""}
#   docker compose -f docker-compose.yml -f docker-compose.tls.yml up --build -d
# Swaps --insecure for the certificate flags and mounts the certificates
# (read-only).  Generated by `python3 scripts/compose-scale.py {count}{flags}`.
{auth_note}
services:
  superlink:
    command:
""", _command(_superlink_arguments(tls=True, node_auth=node_auth)), """\
    volumes:
""", _mount("ca.crt"), _mount("server.pem"), _mount("server.key"), """\

  superexec-serverapp:
    command:
""", _command(_serverapp_arguments(tls=True)), """\
    volumes:
""", _mount("ca.crt")]
    for index in range(count):
        out += [f"""\

  supernode-{index}:
    command:
""", _command(_supernode_arguments(index, count, tls=True, node_auth=node_auth)), """\
    volumes:
""", _mount("ca.crt")]
        if node_auth:
            out.append(_mount(f"supernode-keys/supernode-{index}"))
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write fedroute's Docker Compose file for N SuperNodes to standard output.")
    parser.add_argument("count", metavar="N", type=int, help="number of SuperNodes (partition ids 0 … N-1)")
    parser.add_argument("--tls", action="store_true", help="write the TLS override instead of the base file")
    parser.add_argument("--no-node-auth", action="store_true",
                        help="with --tls: leave SuperNode authentication out (development only)")
    args = parser.parse_args(argv)
    if args.no_node_auth and not args.tls:
        parser.error("--no-node-auth is an option of --tls (the base file has no authentication)")
    try:
        text = tls_override(args.count, not args.no_node_auth) if args.tls else base_compose(args.count)
    except ValueError as error:
        parser.error(str(error))
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
