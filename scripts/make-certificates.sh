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
# which remakes the CA and the server certificate.  Needs openssl; --node-keys
# needs ssh-keygen (openssh-client).
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

die() {
    echo "make-certificates.sh: $*" >&2
    exit 1
}

repository="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repository/certificates"
days=365
node_keys=0
force=0
extra_sans=()

while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) [[ $# -ge 2 ]] || die "--out needs a directory"; out="$2"; shift 2 ;;
        --days) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die "--days needs a positive integer"; days="$2"; shift 2 ;;
        --node-keys) [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || die "--node-keys needs a count"; node_keys="$2"; shift 2 ;;
        --san)
            [[ $# -ge 2 && "$2" =~ ^(DNS|IP):[^,[:space:]]+$ ]] || die "--san needs DNS:<name> or IP:<address>"
            extra_sans+=("$2"); shift 2 ;;
        --force) force=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

command -v openssl >/dev/null 2>&1 || die "openssl not found (Debian/Ubuntu: apt-get install openssl)"
if [[ "$node_keys" -gt 0 ]]; then
    command -v ssh-keygen >/dev/null 2>&1 || die "ssh-keygen not found (Debian/Ubuntu: apt-get install openssh-client)"
fi

mkdir -p "$out"
cd "$out"

san="DNS:superlink, DNS:localhost, IP:127.0.0.1"
for entry in "${extra_sans[@]+"${extra_sans[@]}"}"; do
    san="$san, $entry"
done

config="$(mktemp)"
trap 'rm -f "$config" server.csr' EXIT
cat > "$config" <<EOF
[req]
distinguished_name = dn
prompt = no

[dn]
CN = fedroute

[v3_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[v3_server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
subjectAltName = $san
EOF

umask 077
if [[ "$force" -eq 1 || ! -f ca.crt || ! -f ca.key ]]; then
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-384 -out ca.key 2>/dev/null
    openssl req -x509 -new -key ca.key -sha384 -days "$days" -subj "/CN=fedroute CA" \
        -config "$config" -extensions v3_ca -out ca.crt
    rm -f server.pem  # a new CA needs a new server certificate
    echo "made CA: $out/ca.crt"
else
    echo "kept CA: $out/ca.crt (--force remakes it)"
fi

if [[ "$force" -eq 1 || ! -f server.pem || ! -f server.key ]]; then
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-384 -out server.key 2>/dev/null
    openssl req -new -key server.key -sha384 -subj "/CN=superlink" -config "$config" -out server.csr
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -set_serial "0x$(openssl rand -hex 16)" \
        -days "$days" -sha384 -extfile "$config" -extensions v3_server -out server.pem 2>/dev/null
    echo "made SuperLink certificate: $out/server.pem (SAN: $san)"
else
    echo "kept SuperLink certificate: $out/server.pem (--force remakes it)"
fi
chmod 644 ca.crt server.pem
chmod 600 ca.key server.key
openssl verify -CAfile ca.crt server.pem >/dev/null || die "server.pem does not verify against ca.crt"

if [[ "$node_keys" -gt 0 ]]; then
    mkdir -p supernode-keys
    for ((i = 0; i < node_keys; i++)); do
        key="supernode-keys/supernode-$i"
        if [[ -f "$key" && -f "$key.pub" && "$force" -eq 0 ]]; then
            echo "kept SuperNode key: $out/$key"
            continue
        fi
        rm -f "$key" "$key.pub"
        ssh-keygen -q -t ecdsa -b 384 -N "" -C "fedroute-supernode-$i" -f "$key"
        chmod 600 "$key"
        chmod 644 "$key.pub"
        echo "made SuperNode key: $out/$key (public: $key.pub)"
    done
    echo
    echo "Register the public keys with the SuperLink (it must run with --enable-supernode-auth):"
    for ((i = 0; i < node_keys; i++)); do
        echo "  flwr supernode register $out/supernode-keys/supernode-$i.pub <connection>"
    done
fi

echo
echo "Docker on Linux: the Flower containers run as uid 49999 and the private keys are"
echo "mode 600; let the containers read the ones they mount with"
if [[ "$node_keys" -gt 0 ]]; then
    echo "  sudo chown 49999:49999 $out/server.key $out/supernode-keys/supernode-*"
else
    echo "  sudo chown 49999:49999 $out/server.key"
fi
