"""TLS material and SuperNode key pairs for a Flower deployment, with ``cryptography`` only.

``fedroute certificates`` (and ``scripts/make-certificates.sh``, which calls it)
writes into one directory:

=============================================  ==================================================
``ca.key``, ``ca.crt``                          a private CA (ECDSA P-384, self-signed, ``CA:TRUE``)
``server.key``, ``server.pem``                  the SuperLink certificate signed by the CA: SAN
                                                ``DNS:superlink``, ``DNS:localhost``,
                                                ``IP:127.0.0.1`` plus every extra SAN, extended key
                                                usage ``serverAuth``
``supernode-keys/supernode-<i>`` and ``.pub``   with ``node_keys = N``: one ECDSA P-384 key pair per
                                                SuperNode in OpenSSH format — what Flower 1.42
                                                reads (``flower-supernode
                                                --auth-supernode-private-key`` loads an OpenSSH
                                                EC private key, ``flwr supernode register`` an
                                                OpenSSH public key on a NIST curve)
=============================================  ==================================================

Private keys are written mode 600, certificates and public keys 644.  Existing
files are kept (so node keys can be added later) unless ``force``, which remakes
the CA and the server certificate (and the node keys asked for).  Nothing here
calls ``openssl`` or ``ssh-keygen``: ``cryptography`` is installed with Flower.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedroute.core.validation import invalid

__all__ = [
    "DEFAULT_SANS",
    "CertificateFiles",
    "make_certificates",
    "make_node_key_pair",
    "parse_san",
]

DEFAULT_SANS = ("DNS:superlink", "DNS:localhost", "IP:127.0.0.1")
"""Names every SuperLink certificate holds: the compose service, and loopback for the CLI."""

_CURVE = ec.SECP384R1
_HASH = hashes.SHA384
_PRIVATE_MODE, _PUBLIC_MODE = 0o600, 0o644


@dataclass(frozen=True)
class CertificateFiles:
    """Where :func:`make_certificates` put everything, and what it made or kept."""

    ca: Path
    """``ca.crt``: the root certificate SuperNodes and ``flwr`` trust."""
    ca_key: Path
    cert: Path
    """``server.pem``: the SuperLink certificate."""
    key: Path
    """``server.key``: the SuperLink private key."""
    node_keys: tuple[Path, ...] = ()
    """Private keys ``supernode-keys/supernode-<i>`` (public key: the same path + ``.pub``)."""
    made: tuple[Path, ...] = field(default=())
    """Files written by this call (the others existed and were kept)."""


def parse_san(entry: str) -> x509.GeneralName:
    """``DNS:<name>`` or ``IP:<address>`` as a subject-alternative-name entry.

    Raises
    ------
    ValueError
        Naming ``--san`` and the allowed forms.
    """
    kind, _, value = entry.partition(":")
    if kind == "DNS" and value and not any(character.isspace() or character == "," for character in value):
        return x509.DNSName(value)
    if kind == "IP":
        try:
            return x509.IPAddress(ipaddress.ip_address(value))
        except ValueError:
            pass
    raise invalid("--san", entry, "DNS:<name> or IP:<address> (e.g. DNS:flower.example.org)")


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` created with ``mode`` (private keys are never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "wb") as stream:
        stream.write(data)
    os.chmod(path, mode)


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)


def _make_ca(days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(_CURVE())
    start, end = _validity(days)
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name("fedroute CA")).issuer_name(_name("fedroute CA"))
        .public_key(public).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, _HASH())
    )
    return key, certificate


def _make_server_certificate(ca_key: ec.EllipticCurvePrivateKey, ca_certificate: x509.Certificate,
                             sans: Sequence[x509.GeneralName], days: int,
                             ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(_CURVE())
    start, end = _validity(days)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name("superlink")).issuer_name(ca_certificate.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        .sign(ca_key, _HASH())
    )
    return key, certificate


def make_node_key_pair(comment: str = "") -> tuple[bytes, bytes]:
    """One SuperNode key pair: ``(private key, public key)`` in OpenSSH format, ECDSA P-384.

    The private key is what ``flower-supernode --auth-supernode-private-key`` loads;
    the public key (one line, ``ecdsa-sha2-nistp384 … [comment]``) is what
    ``flwr supernode register`` takes.
    """
    key = ec.generate_private_key(_CURVE())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public + (f" {comment}".encode() if comment else b"") + b"\n"


def _load_certificate(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _checked_sans(days: int, node_keys: int, sans: Sequence[str]) -> tuple[str, ...]:
    """The SuperLink's subject alternative names (:data:`DEFAULT_SANS` and ``sans``), once they, ``days`` and
    ``node_keys`` are valid (``ValueError``)."""
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise invalid("--days", days, "an integer ≥ 1")
    if isinstance(node_keys, bool) or not isinstance(node_keys, int) or node_keys < 0:
        raise invalid("--node-keys", node_keys, "an integer ≥ 0")
    names = (*DEFAULT_SANS, *sans)
    for entry in names:
        parse_san(entry)
    return names


def _ca(out: Path, days: int, force: bool, say: Callable[[str], None],
        made: list[Path]) -> tuple[PrivateKeyTypes, x509.Certificate]:
    """The CA's key and certificate: made (``force``, or either file missing) or kept."""
    ca, ca_key_path = out / "ca.crt", out / "ca.key"
    if not force and ca.is_file() and ca_key_path.is_file():
        say(f"kept CA: {ca} (--force remakes it)")
        return serialization.load_pem_private_key(ca_key_path.read_bytes(), None), _load_certificate(ca)
    ca_key, ca_certificate = _make_ca(days)
    _write(ca_key_path, _private_pem(ca_key), _PRIVATE_MODE)
    _write(ca, ca_certificate.public_bytes(serialization.Encoding.PEM), _PUBLIC_MODE)
    made += [ca_key_path, ca]
    (out / "server.pem").unlink(missing_ok=True)  # a new CA needs a new server certificate
    say(f"made CA: {ca}")
    return ca_key, ca_certificate


def _server_certificate(out: Path, ca_key: PrivateKeyTypes, ca_certificate: x509.Certificate, names: Sequence[str],
                        days: int, force: bool, say: Callable[[str], None], made: list[Path]) -> None:
    """The SuperLink's key and certificate: made (``force``, or either file missing) or kept; then verified
    against the CA (``ValueError``: remake both)."""
    cert, key = out / "server.pem", out / "server.key"
    if force or not (cert.is_file() and key.is_file()):
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{out / 'ca.key'} is not an elliptic-curve key; remake the CA with --force")
        server_key, server_certificate = _make_server_certificate(ca_key, ca_certificate,
                                                                      [parse_san(name) for name in names], days)
        _write(key, _private_pem(server_key), _PRIVATE_MODE)
        _write(cert, server_certificate.public_bytes(serialization.Encoding.PEM), _PUBLIC_MODE)
        made += [key, cert]
        say(f"made SuperLink certificate: {cert} (SAN: {', '.join(names)})")
    else:
        say(f"kept SuperLink certificate: {cert} (--force remakes it)")
    try:
        _load_certificate(cert).verify_directly_issued_by(ca_certificate)
    except (InvalidSignature, ValueError, TypeError) as error:
        raise ValueError(f"{cert} does not verify against {out / 'ca.crt'} ({error!r}); remake both with --force") \
            from None


def _node_key_pairs(out: Path, count: int, force: bool, say: Callable[[str], None], made: list[Path]) -> list[Path]:
    """The private keys ``supernode-keys/supernode-0 … count-1`` (each with its ``.pub``): made or kept."""
    private_keys = []
    for index in range(count):
        private_path = out / "supernode-keys" / f"supernode-{index}"
        public_path = private_path.with_name(private_path.name + ".pub")
        private_keys.append(private_path)
        if private_path.is_file() and public_path.is_file() and not force:
            say(f"kept SuperNode key: {private_path}")
            continue
        private, public = make_node_key_pair(f"fedroute-supernode-{index}")
        _write(private_path, private, _PRIVATE_MODE)
        _write(public_path, public, _PUBLIC_MODE)
        made += [private_path, public_path]
        say(f"made SuperNode key: {private_path} (public: {public_path.name})")
    return private_keys


def make_certificates(directory: str | Path, *, days: int = 365, sans: Sequence[str] = (), node_keys: int = 0,
                      force: bool = False, report: Optional[Callable[[str], None]] = None) -> CertificateFiles:
    """Make (or keep) the CA, the SuperLink certificate and ``node_keys`` SuperNode key pairs.

    Parameters
    ----------
    directory : path
        Output directory (created).
    days : int
        Validity of new certificates, ≥ 1.
    sans : sequence of str
        Extra subject alternative names, ``DNS:<name>`` or ``IP:<address>``, besides
        :data:`DEFAULT_SANS`.
    node_keys : int
        SuperNode key pairs ``supernode-keys/supernode-0 … N-1`` (≥ 0); existing ones are kept.
    force : bool
        Remake the CA, the server certificate and the requested node keys.
    report : callable, optional
        Called with one line per file made or kept (e.g. ``print``).

    Raises
    ------
    ValueError
        A bad ``days``, ``node_keys`` or SAN (the message names the option).
    """
    names = _checked_sans(days, node_keys, sans)
    say = report or (lambda line: None)
    out = Path(directory).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    ca_key, ca_certificate = _ca(out, days, force, say, made)
    _server_certificate(out, ca_key, ca_certificate, names, days, force, say, made)
    private_keys = _node_key_pairs(out, node_keys, force, say, made)
    return CertificateFiles(ca=out / "ca.crt", ca_key=out / "ca.key", cert=out / "server.pem", key=out / "server.key",
                            node_keys=tuple(private_keys), made=tuple(made))
