#!/usr/bin/env bash
# Install (Debian packages) and start PostgreSQL on 127.0.0.1 and headless Chromium for the tests.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
command -v pg_ctlcluster >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
ver=$(ls /usr/lib/postgresql | sort -n | tail -1)
if ! pg_lsclusters -h | grep -q online; then
  pg_lsclusters -h | grep -q "^$ver main" || pg_createcluster "$ver" main >/dev/null
  pg_ctlcluster "$ver" main start
fi
su postgres -c "psql -qtAc \"SELECT 1 FROM pg_roles WHERE rolname='autoscout'\"" | grep -q 1 \
  || su postgres -c "psql -qc \"CREATE ROLE autoscout LOGIN SUPERUSER PASSWORD 'autoscout'\""
su postgres -c "psql -qtAc \"SELECT 1 FROM pg_database WHERE datname='autoscout'\"" | grep -q 1 \
  || su postgres -c "createdb -O autoscout autoscout"
echo "services: postgresql $ver on 127.0.0.1:5432, chromium at $(command -v chromium)"
