"""The trail's Parquet export and archive: old entries copied out of Postgres, by day.

Layout of an export directory:

    <dir>/_agentpost_export.json              the manifest (below)
    <dir>/batch-000001/day=2026-11-01/*.parquet
    <dir>/batch-000002/day=...

Each run of the export copies the entries with ids above the manifest's `upto_id` and at
before a day boundary into a new batch directory (written whole by Spark, replaced if a
crashed run left one), then rewrites the manifest (a temporary file, renamed): a batch counts
only once the manifest lists it, so an entry is never read twice or lost. Jobs read the
listed batches plus the live tail, ids above `upto_id`, from Postgres. The export copies: the
entries stay in Postgres, where the store's own `verify_trail` and the row checks need them.

Written by `agentpost spark export` (copies) and by `agentpost trail archive`
(`store.trail_archive`: the copy before a prune, with the verified checkpoint of its cut).

Manifest, version 2 (version 1 is the same without `cuts`, and is still read):

    {"format": "agentpost.trail-export", "version": 2, "upto_id": 1234,
     "batches": [{"dir": "batch-000001", "from_id": 1, "to_id": 1234, "rows": 1234,
                  "before": "2026-11-02T00:00:00+00:00"}],
     "cuts": [{"cut": "2026-11-01", "checkpoint": "cut-2026-11-01.json", "upto_id": 1234,
               "partitions": ["trail_p202610"]}]}

A cut is what `agentpost trail prune` needs: the monthly partitions it may drop, the highest id
archived when it was taken, and the file (beside the manifest) holding the checkpoint a
verification handed back at the cut.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from datetime import date, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentpost.protocol.errors import InvalidInput

MANIFEST = "_agentpost_export.json"
#: the columns an export holds (and a job reads), every one as stored; `at_us` computed as the
#: signed record computes it, so checks compare like with like
TRAIL_COLUMNS = ("id", "chain", "chain_seq", "event", "envelope_id", "at", "at_us", "record",
                 "prev_hash", "hash", "mac")
TRAIL_SELECT = ("SELECT id, chain, chain_seq, event, envelope_id, at, "
                "(extract(epoch FROM at) * 1000000)::bigint AS at_us, record, prev_hash, "
                "hash, mac FROM agentpost.trail")
FORMAT = "agentpost.trail-export"


class Batch(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    dir: str = Field(pattern=r"^batch-\d{6}$")
    from_id: int = Field(ge=1)
    to_id: int = Field(ge=0)
    rows: int = Field(ge=0)
    before: datetime


class Cut(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    cut: date
    checkpoint: str = Field(pattern=r"^cut-\d{4}-\d{2}-\d{2}\.json$")
    upto_id: int = Field(ge=0)
    partitions: list[str]
    #: the copy of the envelope rows of its months (`store.envelope_archive`), beside the
    #: manifest, and how many rows it holds (None: a cut taken before envelopes were pruned,
    #: or with no envelope month to drop)
    envelopes: str | None = Field(default=None, pattern=r"^envelopes-\d{4}-\d{2}-\d{2}$")
    envelope_rows: int = Field(default=0, ge=0)
    #: the same for the route rows of its months (`store.route_archive`)
    routes: str | None = Field(default=None, pattern=r"^routes-\d{4}-\d{2}-\d{2}$")
    route_rows: int = Field(default=0, ge=0)
    #: and for the commands, the sagas and their steps (`store.history_archive`)
    commands: str | None = Field(default=None, pattern=r"^commands-\d{4}-\d{2}-\d{2}$")
    sagas: str | None = Field(default=None, pattern=r"^sagas-\d{4}-\d{2}-\d{2}$")
    saga_steps: str | None = Field(default=None, pattern=r"^saga_steps-\d{4}-\d{2}-\d{2}$")


class Export(BaseModel):
    """An export directory's manifest."""

    model_config = ConfigDict(extra="forbid")

    format: str = Field(default=FORMAT, pattern=f"^{FORMAT}$")
    version: int = Field(default=2, ge=1, le=2)
    upto_id: int = Field(default=0, ge=0)
    batches: list[Batch] = Field(default_factory=list)
    cuts: list[Cut] = Field(default_factory=list)
    path: str = Field(default="", exclude=True)

    def cut(self, day: date) -> Cut | None:
        """The archive's cut at `day`, if it took one."""
        return next((c for c in self.cuts if c.cut == day), None)

    def next_dir(self) -> str:
        return f"batch-{len(self.batches) + 1:06d}"

    def save(self) -> None:
        """Write the manifest whole or not at all (as version 2)."""
        self.version = 2
        target = Path(self.path) / MANIFEST
        tmp = target.with_name(f"{MANIFEST}.{os.getpid()}.tmp")
        try:
            tmp.write_text(self.model_dump_json(indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise InvalidInput(f"cannot write {target}: {exc.strerror or exc}") from None


def load(path: str) -> Export:
    """The export at `path`: its manifest, or an empty export if it has none yet."""
    manifest = Path(path) / MANIFEST
    if not manifest.exists():
        return Export(path=path)
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        export = Export.model_validate(data)
    except (OSError, ValueError, ValidationError) as exc:
        raise InvalidInput(f"{manifest} is not a usable trail export manifest: "
                           f"{str(exc).splitlines()[0]}") from None
    export.path = path
    return export


def pyarrow_modules() -> tuple[Any, Any]:
    """(pyarrow.parquet, pyarrow), or a one-line error that says what to install."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise InvalidInput("the trail archive writes Parquet with pyarrow: install "
                           "airflow-agentpost[archive]") from None
    return pq, pa


def read_rows(directory: Path, columns: tuple[str, ...],
              chunk: int = 20_000) -> Iterator[tuple[Path, list[tuple]]]:
    """The rows of every Parquet file under `directory`, `columns` of each, `chunk` at a time
    with the file they came from; a file unreadable is a one-line InvalidInput."""
    pq, _ = pyarrow_modules()
    for path in sorted(directory.rglob("*.parquet")):
        try:
            for part in pq.ParquetFile(str(path)).iter_batches(batch_size=chunk,
                                                               columns=list(columns)):
                yield path, list(zip(*(part.column(c).to_pylist() for c in columns),
                                     strict=True))
        except (OSError, ValueError) as exc:  # pyarrow's errors are ValueErrors too
            raise InvalidInput(f"cannot read the archive's {path}: "
                               f"{str(exc).splitlines()[0][:200]}") from None
