#!/bin/sh
# Make sure the PostgreSQL JDBC driver jar exists, so the Spark jobs over the trail can read
# the store (tests/spark/test_spark_*.py run them). The jobs look for it at $AGENTPOST_JDBC_JAR,
# default /usr/share/java/postgresql.jar, which Debian's libpostgresql-jdbc-java installs.
# Idempotent: does nothing when the jar is there. Installs the package with apt-get when we
# are root on a Debian-like system; otherwise says what to install and fails, so the Spark
# tests' absence is never silent.
set -eu

JAR="${AGENTPOST_JDBC_JAR:-/usr/share/java/postgresql.jar}"
if [ -f "$JAR" ]; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1 \
        && [ "$JAR" = /usr/share/java/postgresql.jar ]; then
    echo "installing libpostgresql-jdbc-java (Debian package) for the Spark jobs" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends libpostgresql-jdbc-java >/dev/null \
        || { apt-get update >/dev/null && apt-get install -y --no-install-recommends \
             libpostgresql-jdbc-java >/dev/null; }
    [ -f "$JAR" ] && exit 0
fi
echo "the PostgreSQL JDBC driver is missing at $JAR: install it (Debian: apt-get install" \
     "libpostgresql-jdbc-java) or set AGENTPOST_JDBC_JAR to the driver jar" >&2
exit 1
