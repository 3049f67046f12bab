#!/usr/bin/env bash
# make test's Debian packages, when missing and this runs as root (otherwise one line saying
# how): etcd-server (the managers' shared store: the etcd tests, cluster up --nodes 3),
# prometheus (promtool check metrics, and a real Prometheus server that scrapes a test cluster:
# tests/cluster/test_prometheus.py), chromium (the web console's browser tests). Never fails make test by itself: a test that needs a
# missing program fails with the same advice.
set -uo pipefail

missing=()
if ! command -v etcd >/dev/null; then
    missing+=(etcd-server)
fi
if ! command -v chromium >/dev/null; then
    missing+=(chromium fonts-dejavu-core)
fi
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    missing+=(prometheus)
fi
if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing from Debian for the tests: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
            >/tmp/dcpkv-install-test-packages.log 2>&1 \
            || echo "apt-get install ${missing[*]} failed (/tmp/dcpkv-install-test-packages.log)"
    else
        echo "missing for the tests: ${missing[*]}; to install: sudo apt-get install ${missing[*]}"
    fi
fi
exit 0
