# Developer entry points. `make test` is the command CI runs (.ci/run).

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
UV_VERSION := 0.13.8
PYSPARK_VERSION := 4.3.0
# Rebuilt whenever the declared or locked dependencies change.
STAMP := $(VENV)/.agentpost-installed
# --compile-bytecode: every installed module's .pyc is written once, here. Without it, where
# PYTHONDONTWRITEBYTECODE is set (as on these machines) every process compiles what it
# imports anew: importing Airflow took 8 s of CPU instead of 3, in each of the suite's many
# Airflow processes (dag.test runs, standalone's components, the airflow CLI).
UV_INSTALL := $(BIN)/uv pip install --compile-bytecode --python $(BIN)/python

.PHONY: venv test lint schema demo demo-headless bench constraints

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/uv --version 2>/dev/null | grep -q '^uv $(UV_VERSION)' \
		|| $(BIN)/python -m pip install --quiet 'uv==$(UV_VERSION)'
	$(UV_INSTALL) --constraints constraints.txt --build-constraints constraints.txt \
		-e '.[dev,postgres,spark,ai,archive]'
	# The Spark provider pulls pyspark-client, which overwrites part of pyspark: put it back.
	# (uninstall + install reuses uv's cached pyspark build; --reinstall would rebuild it)
	$(BIN)/uv pip uninstall --python $(BIN)/python pyspark
	$(UV_INSTALL) --no-deps 'pyspark==$(PYSPARK_VERSION)'
	# the check the Spark jobs make at start: pyspark's Python files match Spark's JVM
	$(BIN)/agentpost spark check
	# our own modules too (their .pyc is ignored, not wrong, once a file changes)
	$(BIN)/python -m compileall -q -j 0 plugins dags tests > /dev/null
	touch $@

test: venv
	$(BIN)/ruff check .
	# the layering of docs/design.md, as the contracts in pyproject.toml state it
	$(BIN)/lint-imports --no-cache
	# tests/system/test_docker_compose.py runs `docker-compose config`: installed here when missing
	sh docker/ensure-compose-tool.sh
	# tests/system/test_web_browser.py drives headless Chromium: installed here when missing
	sh tests/ensure-browser.sh
	# the Spark jobs read the store over JDBC: Debian's driver jar, installed here when missing
	sh tests/ensure-jdbc-driver.sh
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=25

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

# sql/schema.sql, the schema all the migrations add up to, dumped from a scratch database on
# the discovered Postgres: run it after adding a migration (tests/pg/test_schema_sql.py fails
# until the file matches).
schema: venv
	$(BIN)/python -m agentpost.pg.schema_dump --sql-dir sql

# The example DAGs on airflow standalone until Ctrl-C (which stops everything it started).
demo: venv
	$(BIN)/agentpost demo --airflow

# The same scenarios under dag.test(), no servers; non-zero exit if one fails.
demo-headless: venv
	$(BIN)/agentpost demo --headless

bench: venv
	# bench leases compares with Procrastinate, bench peers with pgmq, pgqueuer and
	# Procrastinate: the `bench` extra brings them
	$(UV_INSTALL) --constraints constraints.txt procrastinate pgmq 'pgqueuer[asyncpg]'
	$(BIN)/agentpost bench envelopes
	$(BIN)/agentpost bench leases
	# agentpost beside pgmq, pgqueuer and Procrastinate, each in its own scratch database
	# (a few minutes; pg-boss and graphile-worker are said skipped)
	$(BIN)/agentpost bench peers
	$(BIN)/agentpost bench marks
	$(BIN)/agentpost bench commands
	$(BIN)/agentpost bench airflow
	# each agent tool direct, through AgentTools, the toolset, a pydantic-ai agent loop and
	# over MCP (stdio and HTTP, the `ai` extra; without it MCP is said not measured)
	$(BIN)/agentpost bench agents
	# fills scratch stores to 100k and 1M envelopes (several minutes); --large adds 10M
	$(BIN)/agentpost bench growth
	# verify_trail(since=) with and without row digests over 200k envelopes (a few minutes)
	$(BIN)/agentpost bench since
	# the agentpost pages over 1M trail entries and 100k marks, through the Airflow app
	$(BIN)/agentpost bench ui

# Re-resolve the full lock after changing dependencies in pyproject.toml. The versions already
# in constraints.txt are kept where they still fit (uv prefers the output file's pins); every
# extra is locked, so the Docker image (postgres, celery, spark) installs the tested set too.
constraints: venv
	$(BIN)/uv pip compile pyproject.toml --extra dev --extra bench --extra postgres --extra celery \
		--extra spark --extra ai \
		--python-version 3.11 -o constraints.txt
