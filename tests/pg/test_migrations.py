"""agentpost.pg.migrations against a real Postgres, with throwaway migration files."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from agentpost.pg.migrations import (
    FORMER_CHECKSUMS,
    MigrationError,
    applied,
    load,
    migrate,
    pending,
)
from dbtools import connect, rows
from dbtools import query as _query


def _write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path




@pytest.fixture
def sql_dir(tmp_path: Path) -> Path:
    # numeric, not lexical, order: 2 before 10; the second file needs the first one's table
    _write(
        tmp_path,
        "10_third.sql",
        "INSERT INTO agentpost.steps (name) VALUES ('third');",
    )
    _write(
        tmp_path,
        "1_first.sql",
        "CREATE TABLE agentpost.steps (id serial PRIMARY KEY, name text NOT NULL);\n"
        "INSERT INTO agentpost.steps (name) VALUES ('first');",
    )
    _write(tmp_path, "2_second.sql", "INSERT INTO agentpost.steps (name) VALUES ('second');")
    _write(tmp_path, "notes.sql", "this is not a migration and is never run")
    _write(tmp_path, "README", "ignored")
    return tmp_path


def _steps(dsn: str) -> list[str]:
    return [name for (name,) in _query(dsn, "SELECT name FROM agentpost.steps ORDER BY id")]


def test_load_sorts_numerically_and_ignores_other_files(sql_dir: Path) -> None:
    migrations = load(sql_dir)
    assert [m.name for m in migrations] == ["1_first.sql", "2_second.sql", "10_third.sql"]
    assert [m.version for m in migrations] == [1, 2, 10]
    first = migrations[0]
    assert first.checksum == hashlib.sha256((sql_dir / first.name).read_bytes()).hexdigest()
    assert [m.name for m in load(str(sql_dir))] == [m.name for m in migrations]


def test_load_rejects_duplicate_numbers(sql_dir: Path) -> None:
    _write(sql_dir, "0002_again.sql", "SELECT 1;")
    with pytest.raises(MigrationError, match="two migrations numbered 2"):
        load(sql_dir)


def test_applies_in_order_and_records(empty_dsn: str, sql_dir: Path) -> None:
    assert applied(empty_dsn) == []
    assert pending(empty_dsn, source=sql_dir) == ["1_first.sql", "2_second.sql", "10_third.sql"]

    assert migrate(empty_dsn, source=sql_dir) == ["1_first.sql", "2_second.sql", "10_third.sql"]

    assert _steps(empty_dsn) == ["first", "second", "third"]
    records = applied(empty_dsn)
    assert [(r.version, r.name) for r in records] == [
        (1, "1_first.sql"),
        (2, "2_second.sql"),
        (10, "10_third.sql"),
    ]
    assert [r.checksum for r in records] == [m.checksum for m in load(sql_dir)]
    assert all(r.applied_at.tzinfo is not None for r in records)
    assert pending(empty_dsn, source=sql_dir) == []


def test_second_run_is_a_noop_and_later_files_apply(empty_dsn: str, sql_dir: Path) -> None:
    migrate(empty_dsn, source=sql_dir)
    before = applied(empty_dsn)

    assert migrate(empty_dsn, source=sql_dir) == []
    assert applied(empty_dsn) == before
    assert _steps(empty_dsn) == ["first", "second", "third"]

    _write(sql_dir, "11_fourth.sql", "INSERT INTO agentpost.steps (name) VALUES ('fourth');")
    assert migrate(empty_dsn, source=sql_dir) == ["11_fourth.sql"]
    assert _steps(empty_dsn) == ["first", "second", "third", "fourth"]


def test_edited_migration_is_refused(empty_dsn: str, sql_dir: Path) -> None:
    migrate(empty_dsn, source=sql_dir)
    _write(sql_dir, "2_second.sql", "INSERT INTO agentpost.steps (name) VALUES ('edited');")
    _write(sql_dir, "11_fourth.sql", "INSERT INTO agentpost.steps (name) VALUES ('fourth');")

    with pytest.raises(MigrationError, match=r"2_second\.sql changed after it was applied"):
        migrate(empty_dsn, source=sql_dir)
    # nothing ran: the check happens before any pending file is applied
    assert _steps(empty_dsn) == ["first", "second", "third"]
    assert [r.version for r in applied(empty_dsn)] == [1, 2, 10]


def test_renamed_migration_is_refused(empty_dsn: str, sql_dir: Path) -> None:
    migrate(empty_dsn, source=sql_dir)
    (sql_dir / "2_second.sql").rename(sql_dir / "2_renamed.sql")
    with pytest.raises(MigrationError, match=r"applied as 2_second\.sql"):
        migrate(empty_dsn, source=sql_dir)


def test_failing_migration_rolls_back_only_itself(empty_dsn: str, sql_dir: Path) -> None:
    _write(
        sql_dir,
        "3_broken.sql",
        "INSERT INTO agentpost.steps (name) VALUES ('half');\nSELECT * FROM no_such_table;",
    )
    with pytest.raises(MigrationError, match=r"3_broken\.sql failed.*no_such_table"):
        migrate(empty_dsn, source=sql_dir)
    assert _steps(empty_dsn) == ["first", "second"]
    assert [r.version for r in applied(empty_dsn)] == [1, 2]

    _write(sql_dir, "3_broken.sql", "INSERT INTO agentpost.steps (name) VALUES ('fixed');")
    assert migrate(empty_dsn, source=sql_dir) == ["3_broken.sql", "10_third.sql"]
    assert _steps(empty_dsn) == ["first", "second", "fixed", "third"]


def test_concurrent_migrates_apply_each_file_once(empty_dsn: str, sql_dir: Path) -> None:
    # slow files widen the window in which the callers overlap
    _write(
        sql_dir,
        "4_slow.sql",
        "SELECT pg_sleep(0.3);\nINSERT INTO agentpost.steps (name) VALUES ('slow');",
    )
    callers = 4
    barrier = threading.Barrier(callers)
    results: list[list[str]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            barrier.wait()
            names = migrate(empty_dsn, source=sql_dir)
            with lock:
                results.append(names)
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert len(results) == callers
    everything = [name for names in results for name in names]
    assert sorted(everything) == sorted(m.name for m in load(sql_dir))
    assert _steps(empty_dsn) == ["first", "second", "slow", "third"]
    assert [r.version for r in applied(empty_dsn)] == [1, 2, 4, 10]


def test_package_migrations_apply_cleanly(empty_dsn: str) -> None:
    names = [m.name for m in load()]
    assert migrate(empty_dsn) == names
    assert migrate(empty_dsn) == []
    assert [r.name for r in applied(empty_dsn)] == names


def test_dsn_fixture_is_migrated_and_private(dsn: str, module_dsn: str) -> None:
    expected = [m.name for m in load()]
    assert [r.name for r in applied(dsn)] == expected
    assert [r.name for r in applied(module_dsn)] == expected
    (name,) = _query(dsn, "SELECT current_database()")[0]
    (module_name,) = _query(module_dsn, "SELECT current_database()")[0]
    assert name != module_name
    assert name.startswith("agentpost_test_")


def test_a_comment_corrected_after_release_is_accepted(empty_dsn: str) -> None:
    """A database that recorded a file's earlier text, listed in FORMER_CHECKSUMS (its
    comments corrected, never its SQL), still migrates; any other checksum is still refused."""
    migrate(empty_dsn)
    [(name, earlier)] = [(n, next(iter(c))) for n, c in FORMER_CHECKSUMS.items()]
    conn = connect(empty_dsn)
    try:
        rows(conn, "UPDATE agentpost.schema_migrations SET checksum = %s WHERE name = %s",
             (earlier, name))
        assert migrate(empty_dsn) == []
        rows(conn, "UPDATE agentpost.schema_migrations SET checksum = 'x' WHERE name = %s",
             (name,))
    finally:
        conn.close()
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrate(empty_dsn)
