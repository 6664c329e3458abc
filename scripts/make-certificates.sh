#!/usr/bin/env bash
# Make the TLS material for fedroute's Flower deployment (docs/deployment.md):
#
#   ca.key, ca.crt          a private CA (ECDSA P-384, self-signed)
#   server.key, server.pem  the SuperLink certificate, signed by the CA, with
#                           SAN DNS:superlink, DNS:localhost, IP:127.0.0.1
#                           (+ every --san) and extendedKeyUsage serverAuth
#   supernode-keys/supernode-<i>{,.pub}
#                           with --node-keys N: one ECDSA P-384 key pair per
#                           SuperNode, OpenSSH format (what Flower 1.42 reads
#                           for SuperNode authentication)
#
# Usage: scripts/make-certificates.sh [--out DIR] [--days DAYS] [--san DNS:name|IP:addr]...
#                                     [--node-keys N] [--force]
#
# DIR defaults to certificates/ in the repository root (git-ignored).  Existing
# files are kept (so --node-keys can be added later) unless --force is given,
# which remakes the CA and the server certificate.
#
# This is `fedroute certificates` with the repository's certificates/ as the
# default output: it needs the installed package (pip install -e .), whose
# `cryptography` makes everything — no openssl or ssh-keygen.
set -euo pipefail

repository="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

for argument in "$@"; do
    if [[ "$argument" == "-h" || "$argument" == "--help" ]]; then
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
    fi
done

python="${PYTHON:-python3}"
if ! "$python" -c "import fedroute.deployment.certificates" >/dev/null 2>&1; then
    echo "make-certificates.sh: the fedroute package is not importable with $python;" \
         "activate its virtualenv (pip install -e .) or set PYTHON=/path/to/venv/bin/python" >&2
    exit 1
fi
# A later --out given by the caller wins (argparse keeps the last value).
exec "$python" -m fedroute certificates --out "$repository/certificates" "$@"
