"""``fedroute certificates``: the TLS certificates and SuperNode keys of a deployment."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fedroute.cli.help import add_command

__all__ = ["add_certificates"]


def _certificates(args: argparse.Namespace) -> int:
    from fedroute.deployment.certificates import make_certificates

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


def add_certificates(commands: Any) -> None:
    """``fedroute certificates`` and its options."""
    certificates = add_command(
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
