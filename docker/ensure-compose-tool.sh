#!/bin/sh
# Make sure `docker-compose` exists, so tests/system/test_docker_compose.py can run
# `docker-compose config` on docker/compose.yaml (no Docker engine is needed for that).
# Idempotent: does nothing when the tool is already on PATH. Installs Debian's
# docker-compose package with apt-get when we are root on a Debian-like system; otherwise
# says what to install and fails, so the test's absence is never silent.
set -eu

if command -v docker-compose >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing docker-compose (Debian package) for the compose file check" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends docker-compose >/dev/null \
        || { apt-get update >/dev/null && apt-get install -y --no-install-recommends \
             docker-compose >/dev/null; }
    command -v docker-compose >/dev/null 2>&1 && exit 0
fi
echo "docker-compose is missing: install it (Debian: apt-get install docker-compose)" >&2
exit 1
