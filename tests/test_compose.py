"""Docker deployment files: compose structure, the N-SuperNode generator, the TLS
override and the SuperExec Dockerfile.

No Docker engine or Compose binary is needed: the compose files are parsed with
PyYAML and checked structurally.  Compose's own validation (``docker-compose
config`` of the files alone and merged) is a separate step of ``.ci/run``; the
certificates are tested in ``tests/test_certificates.py``.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPOSITORY = Path(__file__).resolve().parents[1]
GENERATOR = REPOSITORY / "scripts" / "compose-scale.py"
DOCKERFILE = REPOSITORY / "docker" / "Dockerfile.superexec"
DEFAULT_SUPERNODES = 4
HOUSING_SOURCE = "./tasks/data/california_housing.csv.gz"
SUPERLINK_ADDRESS = "superlink:8000"
CERTIFICATES = "/app/certificates"
_DEFAULT = re.compile(r"\$\{(\w+):-([^}]*)\}")


@functools.cache
def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compose_scale", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_generator(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(GENERATOR), *arguments], capture_output=True, text=True, timeout=30)


def _resolve(text: str) -> str:
    """Compose's ``${VAR:-default}`` with every variable unset."""
    return _DEFAULT.sub(lambda match: match.group(2), text)


def _option(command: list[str], flag: str) -> str:
    assert command.count(flag) == 1, (flag, command)
    return str(command[command.index(flag) + 1])


def _load(text: str) -> dict[str, Any]:
    document = yaml.safe_load(text)
    assert isinstance(document, dict)
    return document


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path → host source of a service's bind mounts and volumes."""
    mounts = {}
    for entry in service.get("volumes", []):
        source, target, *_ = entry.split(":")
        mounts[target] = source
    return mounts


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    return _load((REPOSITORY / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def committed_tls() -> dict[str, Any]:
    return _load((REPOSITORY / "docker-compose.tls.yml").read_text())


# --------------------------------------------------------------------------- base file


def check_base_structure(document: dict[str, Any], count: int) -> None:
    """Everything the base compose file for ``count`` SuperNodes must hold."""
    services = document["services"]
    supernodes = [f"supernode-{i}" for i in range(count)]
    clientapps = [f"superexec-clientapp-{i}" for i in range(count)]
    assert set(services) == {"superlink", "superexec-serverapp", *supernodes, *clientapps}

    superlink = services["superlink"]
    assert _resolve(superlink["image"]).startswith("flwr/superlink:1.42.")
    command = superlink["command"]
    assert "--insecure" in command and _option(command, "--isolation") == "process"
    assert _option(command, "--host") == "0.0.0.0" and _option(command, "--port") == "8000"
    assert "--disable-runtime-dependency-installation" in command
    assert _option(command, "--database") == "/app/superlink.db" and _mounts(superlink) == {"/app": "superlink-state"}
    assert superlink["environment"]["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    published = [_resolve(str(port)) for port in superlink["ports"]]
    assert published == ["127.0.0.1:8000:8000"]
    assert "8000" in " ".join(superlink["healthcheck"]["test"])

    serverapp = services["superexec-serverapp"]
    assert serverapp["command"] == ["--insecure", "--runtime-api-address", SUPERLINK_ADDRESS]
    assert serverapp["depends_on"] == {"superlink": {"condition": "service_healthy"}}
    assert _mounts(serverapp) == {"/app/results": "results", "/app/checkpoints": "checkpoints",
                                  "/app/data/california_housing.csv.gz": HOUSING_SOURCE}
    assert serverapp["environment"]["FEDROUTE_RESULTS_ROOT"] == "/app"
    assert serverapp["environment"]["FEDROUTE_CHECKPOINT_DIR"] == "/app/checkpoints"
    assert set(document["volumes"]) == {"results", "checkpoints", "superlink-state",
                                        *(f"client-state-{i}" for i in range(count))}
    assert serverapp["environment"]["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"

    builds = [services[name]["build"] for name in ["superexec-serverapp", *clientapps]]
    assert all(build == builds[0] for build in builds)
    assert (REPOSITORY / builds[0]["context"] / builds[0]["dockerfile"]).resolve() == DOCKERFILE
    assert _resolve(builds[0]["args"]["FLWR_VERSION"]).startswith("1.42.")
    images = {_resolve(services[name]["image"]) for name in ["superexec-serverapp", *clientapps]}
    assert len(images) == 1 and images.pop().endswith(":1.42.0")

    ports = []
    for index, (supernode_name, clientapp_name) in enumerate(zip(supernodes, clientapps)):
        supernode, clientapp = services[supernode_name], services[clientapp_name]
        assert _resolve(supernode["image"]).startswith("flwr/supernode:1.42.")
        command = supernode["command"]
        assert "--insecure" in command and _option(command, "--superlink") == SUPERLINK_ADDRESS
        assert _option(command, "--isolation") == "process" and _option(command, "--host") == "0.0.0.0"
        assert _option(command, "--node-config") == \
            f"partition-id={index} num-partitions={count} state-dir='/app/state'"
        port = int(_option(command, "--port"))
        ports.append(port)
        assert str(port) in " ".join(supernode["healthcheck"]["test"])
        assert supernode["depends_on"] == {"superlink": {"condition": "service_healthy"}}
        assert "ports" not in supernode  # only the SuperLink is published
        # The ClientApp executor pairs with its own SuperNode's Runtime API.
        assert clientapp["command"] == ["--insecure", "--runtime-api-address", f"{supernode_name}:{port}"]
        assert clientapp["depends_on"] == {supernode_name: {"condition": "service_healthy"}}
        assert _mounts(clientapp) == {"/app/state": f"client-state-{index}",  # the ClientApp writes the state
                                      "/app/data/california_housing.csv.gz": HOUSING_SOURCE}
    assert len(set(ports)) == count and 8000 not in ports


def test_committed_compose_has_four_supernodes(committed: dict[str, Any]) -> None:
    check_base_structure(committed, DEFAULT_SUPERNODES)


def test_committed_files_are_the_generator_output_for_four() -> None:
    generator = _generator()
    assert (REPOSITORY / "docker-compose.yml").read_text() == generator.base_compose(DEFAULT_SUPERNODES)
    assert (REPOSITORY / "docker-compose.tls.yml").read_text() == generator.tls_override(DEFAULT_SUPERNODES)


@pytest.mark.parametrize("count", [3, 7])
def test_generator_writes_n_supernodes(count: int, tmp_path: Path) -> None:
    completed = _run_generator(str(count))
    assert completed.returncode == 0, completed.stderr
    target = tmp_path / "docker-compose.generated.yml"
    target.write_text(completed.stdout)
    document = _load(target.read_text())
    check_base_structure(document, count)
    node_configs = sorted(_option(service["command"], "--node-config")
                          for name, service in document["services"].items() if name.startswith("supernode-"))
    assert node_configs == sorted(f"partition-id={i} num-partitions={count} state-dir='/app/state'"
                                  for i in range(count))
    check_tls_override(_load(_generator().tls_override(count)), document, count, node_auth=True)
    check_tls_override(_load(_generator().tls_override(count, node_auth=False)), document, count, node_auth=False)


@pytest.mark.parametrize("arguments", [["0"], ["-2"], ["three"], ["4", "--no-node-auth"], ["4", "--node-auth"], []])
def test_generator_rejects_bad_arguments(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        _generator().main(arguments)
    assert stopped.value.code == 2 and capsys.readouterr().out == ""


# --------------------------------------------------------------------------- TLS override


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Compose's merge for the keys the override uses: ``command`` replaced, volumes added."""
    merged = {name: dict(service) for name, service in base["services"].items()}
    for name, patch in override["services"].items():
        assert name in merged, f"override names unknown service {name}"
        assert set(patch) <= {"command", "volumes"}, patch.keys()
        merged[name]["command"] = patch["command"]
        merged[name]["volumes"] = list(merged[name].get("volumes", [])) + list(patch.get("volumes", []))
    return merged


def _check_mounted(service: dict[str, Any], container_path: str) -> None:
    mounts = _mounts(service)
    assert container_path in mounts, (container_path, mounts)
    assert mounts[container_path] == "./certificates/" + container_path.removeprefix(CERTIFICATES + "/")
    assert any(entry.endswith(f"{container_path}:ro") for entry in service["volumes"])


def check_tls_override(override: dict[str, Any], base: dict[str, Any], count: int, node_auth: bool) -> None:
    merged = _merge(base, override)
    expected = {"superlink", "superexec-serverapp", *(f"supernode-{i}" for i in range(count))}
    assert set(override["services"]) == expected

    superlink = merged["superlink"]["command"]
    assert "--insecure" not in superlink
    for flag, name in [("--ssl-ca-certfile", "ca.crt"), ("--ssl-certfile", "server.pem"),
                       ("--ssl-keyfile", "server.key")]:
        assert _option(superlink, flag) == f"{CERTIFICATES}/{name}"
        _check_mounted(merged["superlink"], f"{CERTIFICATES}/{name}")
    assert ("--enable-supernode-auth" in superlink) is node_auth
    # Apart from TLS, the SuperLink runs exactly as in the base file.
    tls_flags = {"--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"}
    stripped = [arg for k, arg in enumerate(superlink)
                if arg not in tls_flags and (k == 0 or superlink[k - 1] not in tls_flags)
                and arg != "--enable-supernode-auth"]
    assert stripped == [arg for arg in base["services"]["superlink"]["command"] if arg != "--insecure"]

    serverapp = merged["superexec-serverapp"]
    assert serverapp["command"] == ["--root-certificates", f"{CERTIFICATES}/ca.crt",
                                    "--runtime-api-address", SUPERLINK_ADDRESS]
    _check_mounted(serverapp, f"{CERTIFICATES}/ca.crt")
    assert _mounts(serverapp)["/app/results"] == "results"  # the base volume survives the merge

    for index in range(count):
        name = f"supernode-{index}"
        command = merged[name]["command"]
        assert "--insecure" not in command
        assert _option(command, "--root-certificates") == f"{CERTIFICATES}/ca.crt"
        _check_mounted(merged[name], f"{CERTIFICATES}/ca.crt")
        base_command = base["services"][name]["command"]
        for flag in ("--superlink", "--node-config", "--port", "--isolation", "--host"):
            assert _option(command, flag) == _option(base_command, flag)
        if node_auth:
            key = f"{CERTIFICATES}/supernode-keys/supernode-{index}"
            assert _option(command, "--auth-supernode-private-key") == key
            _check_mounted(merged[name], key)
        else:
            assert "--auth-supernode-private-key" not in command
            assert not any("supernode-keys" in entry for entry in merged[name]["volumes"])
        # The ClientApp executors are not in the override: unchanged.
        assert merged[f"superexec-clientapp-{index}"] == base["services"][f"superexec-clientapp-{index}"]


def test_committed_tls_override(committed: dict[str, Any], committed_tls: dict[str, Any]) -> None:
    check_tls_override(committed_tls, committed, DEFAULT_SUPERNODES, node_auth=True)


def test_generator_tls_override_without_node_auth(committed: dict[str, Any],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert _generator().main([str(DEFAULT_SUPERNODES), "--tls", "--no-node-auth"]) == 0
    check_tls_override(_load(capsys.readouterr().out), committed, DEFAULT_SUPERNODES, node_auth=False)


# --------------------------------------------------------------------------- issue 11: state, confinement, auth


def test_state_survives_restarts_on_volumes(committed: dict[str, Any]) -> None:
    """Checkpoints, client state, the SuperLink's database and the results are on named volumes, on
    directories the containers' user owns (Docker gives a new named volume the ownership of the
    image's directory)."""
    services = committed["services"]
    named = set(committed["volumes"])
    for name, service in services.items():
        for source in _mounts(service).values():
            assert source in named or source.startswith("./certificates/") or source == HOUSING_SOURCE, (name, source)
    assert "/app/checkpoints" in _mounts(services["superexec-serverapp"])
    for index in range(DEFAULT_SUPERNODES):
        assert "state-dir='/app/state'" in _option(services[f"supernode-{index}"]["command"], "--node-config")
        assert _mounts(services[f"superexec-clientapp-{index}"])["/app/state"] == f"client-state-{index}"
    # The executor image creates the mount points as its own user (app, uid 49999).
    text = DOCKERFILE.read_text()
    assert "mkdir -p /app/results /app/checkpoints /app/state" in text


def test_containers_are_confined(committed: dict[str, Any]) -> None:
    """Every container: no capabilities, no privilege escalation, a memory limit (settable)."""
    limits = {}
    for name, service in committed["services"].items():
        assert service["cap_drop"] == ["ALL"], name
        assert service["security_opt"] == ["no-new-privileges:true"], name
        assert re.fullmatch(r"\$\{[A-Z_]+_MEMORY:-\d+[mg]\}", service["mem_limit"]), name
        limits[name] = _resolve(service["mem_limit"])
        assert "privileged" not in service and "cap_add" not in service, name
    assert limits["superlink"] == "1g" and limits["supernode-0"] == "512m"
    assert limits["superexec-serverapp"] == limits["superexec-clientapp-0"] == "2g"


def test_tls_override_enables_supernode_authentication(committed: dict[str, Any],
                                                       committed_tls: dict[str, Any]) -> None:
    merged = _merge(committed, committed_tls)
    assert "--enable-supernode-auth" in merged["superlink"]["command"]
    for index in range(DEFAULT_SUPERNODES):
        command = merged[f"supernode-{index}"]["command"]
        assert _option(command, "--auth-supernode-private-key") == f"{CERTIFICATES}/supernode-keys/supernode-{index}"
    header = (REPOSITORY / "docker-compose.tls.yml").read_text().split("services:")[0]
    assert f"--node-keys {DEFAULT_SUPERNODES}" in header and "flwr supernode register" in header


def test_docs_describe_what_is_authenticated() -> None:
    """docs/deployment.md says plainly what is and is not authenticated, and no longer describes the
    fixed wait-for-all-nodes bug as a known limitation."""
    text = (REPOSITORY / "docs" / "deployment.md").read_text()
    section = text.split("## What is and is not authenticated", 1)[1].split("\n## ", 1)[0]
    for needle in ("Control API", "no login", "does **not** ask clients for certificates",
                   "--enable-supernode-auth", "--superexec-auth-secret-file", "SUPERLINK_BIND=0.0.0.0", "firewall"):
        assert needle in section, needle
    assert "Known limitation" not in text and "node_wait_timeout`) the ServerApp raises" not in text
    assert "--database" in text and "kill_superlink" in text


# --------------------------------------------------------------------------- Dockerfile


def test_dockerfile_installs_the_apps_dependencies_on_flower_142_superexec_with_cpu_torch() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG FLWR_VERSION=1\.42\.\d+$", text, re.MULTILINE)
    assert re.search(r"^FROM flwr/superexec:\$\{FLWR_VERSION\}", text, re.MULTILINE)
    assert "https://download.pytorch.org/whl/cpu" in text and "torch==${TORCH_VERSION}" in text
    assert re.search(r"^ARG TORCH_VERSION=\d+\.\d+\.\d+$", text, re.MULTILINE)
    assert "--find-links /tmp/context/dist" in text  # the local-wheel way
    assert 'ENTRYPOINT ["flower-superexec"]' in text
    # torch first, so the requirements find it satisfied; the app's code is not in the image (its FAB brings it).
    assert text.index("torch==${TORCH_VERSION}") < text.index("pip install --no-cache-dir -r /tmp/requirements.txt")
    assert "docker/requirements.py /tmp/context/pyproject.toml" in text
    assert not re.search(r"^(COPY|ADD) ", text, re.MULTILINE)
    assert '! python -c "import fedroute"' in text
    ignored = (REPOSITORY / "docker" / "Dockerfile.superexec.dockerignore").read_text().split()
    assert [line for line in ignored if line.startswith(("*", "!"))] == [
        "*", "!pyproject.toml", "!docker/requirements.py", "!dist/torch-*.whl"]


def test_the_images_requirements_are_the_apps_dependencies_without_flower() -> None:
    spec = importlib.util.spec_from_file_location("requirements", REPOSITORY / "docker" / "requirements.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with open(REPOSITORY / "pyproject.toml", "rb") as stream:
        dependencies = tomllib.load(stream)["project"]["dependencies"]
    requirements = module.app_requirements(str(REPOSITORY / "pyproject.toml"))
    assert [d for d in dependencies if d not in requirements] == ["flwr[simulation]>=1.42,<1.43"]
    assert "flwr-datasets>=0.6,<0.7" in requirements and any(d.startswith("torch") for d in requirements)


def test_executors_read_the_housing_table_the_fab_does_not_carry(committed: dict[str, Any]) -> None:
    services = committed["services"]
    executors = ["superexec-serverapp", *(f"superexec-clientapp-{i}" for i in range(DEFAULT_SUPERNODES))]
    for name in executors:
        assert services[name]["environment"]["FEDROUTE_HOUSING_FILE"] == "/app/data/california_housing.csv.gz"
        assert f"{HOUSING_SOURCE}:/app/data/california_housing.csv.gz:ro" in services[name]["volumes"], name
    assert (REPOSITORY / HOUSING_SOURCE).is_file()


# --------------------------------------------------------------------------- certificates


def test_certificates_are_git_ignored() -> None:
    assert "certificates/" in (REPOSITORY / ".gitignore").read_text().splitlines()


# --------------------------------------------------------------------------- docs


def test_deployment_doc_covers_the_files() -> None:
    text = (REPOSITORY / "docs" / "deployment.md").read_text()
    for needle in ("docker-compose.yml", "docker-compose.tls.yml", "scripts/compose-scale.py",
                   "scripts/make-certificates.sh", "fedroute certificates", "docker/Dockerfile.superexec", "8000",
                   "--enable-supernode-auth", "flwr supernode register", "--auth-supernode-private-key",
                   "https://download.pytorch.org/whl/cpu", "dist/"):
        assert needle in text, needle
    native = text.split("## Native deployment", 1)
    section = native[1].split("\n## ", 1)[0] if len(native) == 2 else ""
    assert "TODO" not in section and "fedroute deploy local" in section
