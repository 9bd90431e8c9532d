#!/usr/bin/env bash
# What tests/faults/test_failover.py needs: Patroni (with its etcd client) and etcd from Debian,
# PostgreSQL 15's server binaries (/usr/lib/postgresql/15/bin). Best effort: without root or apt
# the failover test skips. `.ci/run` calls this before pytest.
set -uo pipefail
command -v patroni >/dev/null 2>&1 && command -v etcd >/dev/null 2>&1 \
    && /usr/bin/python3 -c 'import etcd' 2>/dev/null && [ -x /usr/lib/postgresql/15/bin/postgres ] \
    && exit 0
# postgresql-15 only for its binaries: no main cluster on 5432 (nor a started service).
if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
    mkdir -p /etc/postgresql-common 2>/dev/null \
        && echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf 2>/dev/null
fi
{
    apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        patroni python3-etcd etcd-server etcd-client postgresql-15
} </dev/null >/dev/null 2>&1 || echo "note: could not install patroni/etcd; the failover test will skip"
exit 0
