"""CI step: Compose itself validates fedroute's compose files (no Docker engine needed).

    python .ci/check_compose.py PATH/TO/docker-compose

``docker-compose config`` parses, validates (against Compose's schema) and merges
the files; this runs it on the committed base file alone, on the base file merged
with the TLS override (TLS and SuperNode authentication), and on the generator's
output for 3 SuperNodes, with TLS and authentication and with TLS alone.  Run with the interpreter of docker-compose's own
virtualenv (it brings PyYAML).  Exit code 0 iff every check holds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPOSITORY = Path(__file__).resolve().parents[1]
CERTIFICATES = "/app/certificates"


def compose_config(binary: str, files: list[Path]) -> dict:
    """``docker-compose -f F1 -f F2 … config`` from the repository (compose paths are relative to it)."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("FLWR_VERSION", "SUPERLINK_BIND", "COMPOSE_FILE")}
    command = [binary, "--project-directory", str(REPOSITORY)]
    for path in files:
        command += ["-f", str(path)]
    completed = subprocess.run([*command, "config"], capture_output=True, text=True, timeout=120,
                               cwd=REPOSITORY, env=environment)
    if completed.returncode != 0:
        raise SystemExit(f"docker-compose config {' '.join(map(str, files))} failed:\n{completed.stderr}")
    return yaml.safe_load(completed.stdout)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    binary = argv[0]
    version = subprocess.run([binary, "version", "--short"], capture_output=True, text=True, check=True).stdout
    print(f"docker-compose {version.strip()}")
    base, tls = REPOSITORY / "docker-compose.yml", REPOSITORY / "docker-compose.tls.yml"

    alone = compose_config(binary, [base])["services"]
    assert "--insecure" in alone["superlink"]["command"], alone["superlink"]["command"]
    assert alone["superlink"]["image"] == "flwr/superlink:1.42.0", alone["superlink"]["image"]
    # The executors read the housing table the FAB does not carry (a read-only bind mount).
    for name in ("superexec-serverapp", "superexec-clientapp-0"):
        assert alone[name]["environment"]["FEDROUTE_HOUSING_FILE"] == "/app/data/california_housing.csv.gz", name
        assert any(str(volume.get("target", volume) if isinstance(volume, dict) else volume).find(
            "/app/data/california_housing.csv.gz") >= 0 for volume in alone[name]["volumes"]), name
    print(f"ok: {base.name} ({len(alone)} services)")

    merged = compose_config(binary, [base, tls])["services"]
    assert "--insecure" not in merged["superlink"]["command"], merged["superlink"]["command"]
    assert merged["supernode-3"]["command"][:2] == ["--root-certificates", f"{CERTIFICATES}/ca.crt"]
    print(f"ok: {base.name} + {tls.name}")

    assert "--enable-supernode-auth" in merged["superlink"]["command"]
    generator = REPOSITORY / "scripts" / "compose-scale.py"
    with tempfile.TemporaryDirectory(dir=REPOSITORY, prefix=".compose-check-") as scratch:
        generated = Path(scratch) / "base.yml"
        generated.write_text(_generate(generator, "3"))
        for flags, node_auth in ((["--tls"], True), (["--tls", "--no-node-auth"], False)):
            override = Path(scratch) / "tls.yml"
            override.write_text(_generate(generator, "3", *flags))
            services = compose_config(binary, [generated, override])["services"]
            assert ("--enable-supernode-auth" in services["superlink"]["command"]) is node_auth
            assert (f"{CERTIFICATES}/supernode-keys/supernode-2" in services["supernode-2"]["command"]) is node_auth
            assert "supernode-3" not in services
            print(f"ok: compose-scale.py 3 + {' '.join(flags)}")
    return 0


def _generate(generator: Path, *arguments: str) -> str:
    return subprocess.run([sys.executable, str(generator), *arguments], capture_output=True, text=True,
                          check=True).stdout


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
