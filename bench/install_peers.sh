#!/usr/bin/env bash
# make bench's peers (bench/README.md): memcached, Redis and PostgreSQL from Debian's packages
# when one is missing and this runs as root, otherwise one line saying how; then the peers'
# Python client (redis, hiredis: bench/peers-requirements.txt, hash-checked) in .venv-peers/.
# Never fails make bench: a peer that cannot be had is skipped by bench/peers.py.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PEERS_VENV=.venv-peers

missing=()
command -v memcached >/dev/null || missing+=(memcached)
command -v redis-server >/dev/null || missing+=(redis-server)
if ! command -v pg_recvlogical >/dev/null || ! compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null; then
    missing+=(postgresql)
fi
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing the peers from Debian: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
            >/tmp/dcpkv-install-peers.log 2>&1 \
            || echo "apt-get install ${missing[*]} failed (/tmp/dcpkv-install-peers.log): their rows are skipped"
    else
        echo "peers missing: ${missing[*]} (their rows are skipped); to install them: sudo apt-get install ${missing[*]}"
    fi
fi

stamp=$PEERS_VENV/.installed
if [ ! -e "$stamp" ] || [ bench/peers-requirements.txt -nt "$stamp" ]; then
    { "$PYTHON" -m venv --clear "$PEERS_VENV" \
        && "$PEERS_VENV/bin/python" -m pip install --quiet --require-hashes -r bench/peers-requirements.txt \
        && touch "$stamp"; } || echo "the peers' Python client did not install: the Redis rows are skipped"
fi
exit 0
