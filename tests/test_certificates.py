"""TLS certificates and SuperNode keys made with ``cryptography`` (``fedroute certificates``).

The files are made the way a user makes them (``scripts/make-certificates.sh``,
which runs ``fedroute certificates``) and checked with what consumes them:
Python's TLS stack in a real handshake on loopback (strict X.509 checks), and
Flower 1.42's own key loaders (``flwr supernode register`` and
``flower-supernode --auth-supernode-private-key``).  No ``openssl`` or
``ssh-keygen`` is involved.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from fedroute.cli import main
from fedroute.deployment.certificates import make_certificates, make_node_key_pair

REPOSITORY = Path(__file__).resolve().parents[1]
SCRIPT = REPOSITORY / "scripts" / "make-certificates.sh"


def _script(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *arguments], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable})


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The script run for real, as docs/deployment.md tells a user to."""
    out = tmp_path_factory.mktemp("certificates")
    completed = _script("--out", str(out), "--node-keys", "2", "--san", "DNS:flower.example.org", "--days", "30")
    assert completed.returncode == 0, completed.stderr
    assert f"flwr supernode register {out}/supernode-keys/supernode-1.pub" in completed.stdout
    return out


def _certificate(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_server_certificate_is_signed_by_the_ca_for_the_superlink_names(certificates: Path) -> None:
    ca, server = _certificate(certificates / "ca.crt"), _certificate(certificates / "server.pem")
    server.verify_directly_issued_by(ca)  # raises if the signature or the issuer is wrong
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usages = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {"superlink", "localhost", "flower.example.org"}
    assert [str(address) for address in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    lifetime = server.not_valid_after_utc - server.not_valid_before_utc
    assert 29 < lifetime.days <= 30
    for private in ("ca.key", "server.key", "supernode-keys/supernode-0", "supernode-keys/supernode-1"):
        assert (certificates / private).stat().st_mode & 0o077 == 0, private


def _handshake(certificates: Path, server_hostname: str) -> None:
    """A real TLS handshake on loopback: server.pem/server.key served, ca.crt trusted."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(certificates / "server.pem", certificates / "server.key")
    client_context = ssl.create_default_context(cafile=str(certificates / "ca.crt"))
    client_context.verify_flags |= ssl.VERIFY_X509_STRICT
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            connection, _ = listener.accept()
            try:
                with server_context.wrap_socket(connection, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                with client_context.wrap_socket(raw, server_hostname=server_hostname) as tls:
                    tls.sendall(b"x")
        finally:
            thread.join(timeout=5)


@pytest.mark.parametrize("name", ["superlink", "localhost", "127.0.0.1", "flower.example.org"])
def test_tls_handshake_accepts_every_san(certificates: Path, name: str) -> None:
    _handshake(certificates, name)


def test_tls_handshake_rejects_other_names(certificates: Path) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(certificates, "supernode-0")


# Flower's loaders end with flwr_exit() on a bad key, which also starts a thread that calls
# os._exit() a few seconds later: they run in a subprocess, never in the test process.
FLOWER_LOADERS = """
import argparse, json, os, sys
from pathlib import Path
from flwr.cli.supernode.register import try_load_public_key
from flwr.supercore.primitives.asymmetric import public_key_to_bytes
from flwr.supernode.cli.flower_supernode import _try_setup_client_authentication

results = []
for private in sys.argv[1:]:
    result = {"registered": None, "node": None, "curve": None}
    try:  # flwr supernode register PRIVATE.pub <connection>
        result["registered"] = try_load_public_key(Path(private + ".pub")).hex()
    except (SystemExit, Exception):
        pass
    try:  # flower-supernode --auth-supernode-private-key PRIVATE
        arguments = argparse.Namespace(auth_supernode_private_key=private, auth_supernode_public_key=None)
        key, public = _try_setup_client_authentication(arguments)
        result["node"], result["curve"] = public_key_to_bytes(public).hex(), key.curve.name
    except SystemExit:
        pass
    results.append(result)
print(json.dumps(results), flush=True)
os._exit(0)
"""


def _flower_loads(*private_keys: Path) -> list[dict[str, Any]]:
    completed = subprocess.run([sys.executable, "-c", FLOWER_LOADERS, *map(str, private_keys)],
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_node_keys_load_with_flowers_own_loaders(certificates: Path, tmp_path: Path) -> None:
    """``flwr supernode register KEY.pub`` and ``flower-supernode --auth-supernode-private-key KEY``
    (Flower 1.42's functions) accept the pairs, and the registered key is the node's; the same
    loaders refuse a PEM pair (PKCS#8 / SubjectPublicKeyInfo, as ``openssl genpkey`` writes it),
    so the check discriminates."""
    key = ec.generate_private_key(ec.SECP384R1())
    pem = tmp_path / "pem-node"
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    pem.with_name("pem-node.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    keys = certificates / "supernode-keys"
    made = _flower_loads(keys / "supernode-0", keys / "supernode-1", pem)
    for result in made[:2]:
        assert result["registered"] is not None and result["registered"] == result["node"]
        assert result["curve"] == "secp384r1"
    assert made[0]["node"] != made[1]["node"]
    assert made[2] == {"registered": None, "node": None, "curve": None}
    assert not (keys / "supernode-2").exists()


def test_node_key_pair_is_openssh_ecdsa_p384() -> None:
    private, public = make_node_key_pair("node-7")
    assert private.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    assert public.startswith(b"ecdsa-sha2-nistp384 ") and public.endswith(b" node-7\n")
    loaded = serialization.load_ssh_private_key(private, None)
    assert loaded.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) \
        == public.split(b" node-7")[0]


def test_rerun_keeps_the_ca_and_adds_keys_force_remakes(certificates: Path, tmp_path: Path) -> None:
    out = tmp_path / "certificates"
    shutil.copytree(certificates, out)
    ca, node_key = (out / "ca.crt").read_bytes(), (out / "supernode-keys" / "supernode-0").read_bytes()
    files = make_certificates(out, node_keys=3)
    assert (out / "ca.crt").read_bytes() == ca and (out / "supernode-keys" / "supernode-0").read_bytes() == node_key
    assert files.made == (out / "supernode-keys" / "supernode-2", out / "supernode-keys" / "supernode-2.pub")
    forced = make_certificates(out, force=True)
    assert (out / "ca.crt").read_bytes() != ca and out / "server.pem" in forced.made
    _certificate(out / "server.pem").verify_directly_issued_by(_certificate(out / "ca.crt"))


def test_server_certificate_of_another_ca_is_detected(certificates: Path, tmp_path: Path) -> None:
    out = tmp_path / "mixed"
    shutil.copytree(certificates, out)
    other = make_certificates(tmp_path / "other")
    shutil.copy(other.cert, out / "server.pem")
    shutil.copy(other.key, out / "server.key")
    with pytest.raises(ValueError, match="does not verify against"):
        make_certificates(out)


@pytest.mark.parametrize(("arguments", "option"), [
    (["--san", "superlink"], "--san"),
    (["--san", "IP:300.1.2.3"], "--san"),
    (["--san", "DNS:a b"], "--san"),
    (["--days", "0"], "--days"),
    (["--node-keys", "-1"], "--node-keys"),
])
def test_bad_options_are_refused_naming_them(arguments: list[str], option: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certificates", "--out", str(tmp_path / "out"), *arguments]) == 2
    assert option in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything is written
