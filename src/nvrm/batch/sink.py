"""Where batch rows go: a durable JSONL journal, rendered to CSV or Parquet at the end.

Every write appends whole lines in one ``write`` call, then ``flush`` and
``fsync``. A run killed mid-write can leave at most one torn line at the end
of the file; on resume it is cut off (and its rows scored again), so the
output never has missing, duplicated or torn rows.

``.jsonl`` (or ``.json``) outputs are the journal itself. For ``.csv`` and
``.parquet`` the journal is ``OUTPUT.journal.jsonl``; when the run finishes
the final file is written to a temporary name and renamed into place, and the
journal is removed. Resuming a finished CSV/Parquet run reads its keys back
from the final file. The journal is locked while a run writes it: a second run
on the same output is refused, naming the process that holds it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterable

from ..errors import InputError, OutputError
from .journal import Journal, fsync_dir
from .manifest import Key

log = logging.getLogger(__name__)

COLUMNS = ("id", "candidate_index", "candidate", "reward", "error", "num_tokens", "contract", "model_revision", "off_contract", "input_key",
           "uncertainty")
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}


def output_format(path: Path) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputError(str(path), f"unknown output format {path.suffix or '(none)'}; use .jsonl, .csv or .parquet")
    return fmt


def _batch_row(n: int, row: Any) -> str | None:
    if not isinstance(row, dict) or "id" not in row or "candidate_index" not in row:
        return "is not an nvrm batch row (needs id and candidate_index)"
    return None


def repair_journal(path: Path) -> list[dict[str, Any]]:
    """Rows of a batch journal, cutting off a torn last line in place (under the output's lock)."""
    with Journal(path) as journal:
        return journal.rows(_batch_row)


def read_final(path: Path, fmt: str) -> list[dict[str, Any]]:
    """Rows of a finished CSV or Parquet output."""
    if fmt == "csv":
        import pyarrow.csv as pcsv

        types = {"id": "string", "candidate": "string", "error": "string", "contract": "string", "model_revision": "string", "off_contract": "string",
                 "input_key": "string", "uncertainty": "double"}
        options = pcsv.ConvertOptions(column_types=types, strings_can_be_null=True, quoted_strings_can_be_null=False)
        table = pcsv.read_csv(path, convert_options=options)
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
    return table.to_pylist()


def key_of(row: dict[str, Any]) -> Key:
    return (str(row["id"]), int(row["candidate_index"]))


class Sink:
    """Appends rows durably to a locked journal; ``finish`` writes the final file for CSV/Parquet."""

    def __init__(self, output: Path, fmt: str, journal: Journal, rows: list[dict[str, Any]]):
        self.output = output
        self.format = fmt
        self.journal = journal
        self.rows = rows
        """The rows already in the output when it was opened (``--resume``)."""
        self.done: set[Key] = set()
        dup = 0
        for r in rows:
            k = key_of(r)
            dup += k in self.done
            self.done.add(k)
        if dup:
            raise InputError(str(journal.path), f"{dup} duplicated row(s) in the existing output; it was edited or not written by nvrm batch")

    def drop(self, keys: set[Key]) -> None:
        """Remove the rows of ``keys`` from the output (stale on resume), rewriting the journal in place."""
        if not keys:
            return
        self.rows = [r for r in self.rows if key_of(r) not in keys]
        self.done -= keys
        self.journal.replace({c: r.get(c) for c in COLUMNS} for r in self.rows)

    def write(self, rows: Iterable[dict[str, Any]]) -> None:
        rows = list(rows)
        for r in rows:
            k = key_of(r)
            if k in self.done:  # a bug upstream must not duplicate a row
                raise RuntimeError(f"row {k} written twice")
            self.done.add(k)
        self.journal.append({c: r.get(c) for c in COLUMNS} for r in rows)

    def finish(self) -> None:
        try:
            self._finish()
        except OSError as e:
            raise OutputError(str(self.output), e.strerror or type(e).__name__) from e

    def _finish(self) -> None:
        if self.format == "jsonl":
            self.journal.close()
            return
        import pyarrow as pa

        rows = self.journal.rows(_batch_row)
        schema = pa.schema(
            [
                ("id", pa.string()),
                ("candidate_index", pa.int64()),
                ("candidate", pa.string()),
                ("reward", pa.float64()),
                ("error", pa.string()),
                ("num_tokens", pa.int64()),
                ("contract", pa.string()),
                ("model_revision", pa.string()),
                ("off_contract", pa.string()),
                ("input_key", pa.string()),
                ("uncertainty", pa.float64()),
            ]
        )
        table = pa.Table.from_pylist([{c: r.get(c) for c in COLUMNS} for r in rows], schema=schema)
        tmp = self.output.with_name(self.output.name + ".tmp")
        if self.format == "csv":
            import pyarrow.csv as pcsv

            pcsv.write_csv(table, tmp)
        else:
            import pyarrow.parquet as pq

            pq.write_table(table, tmp)
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.output)
        fsync_dir(self.output.parent)
        self.journal.path.unlink()
        self.journal.close()

    def close(self) -> None:
        self.journal.close()


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def open_sink(output: str | Path, *, resume: bool = False, overwrite: bool = False, manifest: str | Path | None = None) -> Sink:
    """Open the output for appending; refuses to clobber unless ``resume`` or ``overwrite``,
    and refuses an output (or its journal) that is the run's own ``manifest``."""
    output = Path(output)
    fmt = output_format(output)
    journal = output if fmt == "jsonl" else output.with_name(output.name + ".journal.jsonl")
    if manifest is not None:
        m = Path(manifest)
        for p in {output, journal}:
            if p.resolve() == m.resolve() or _same_file(p, m):
                raise InputError(str(output), f"is the input manifest {manifest}; choose another output file")
    if output.is_dir():
        raise InputError(str(output), "is a directory; give an output file name")
    if not output.parent.exists():
        raise InputError(str(output), f"folder {output.parent} does not exist")
    exists = output.exists() or journal.exists()
    if exists and not (resume or overwrite):
        raise InputError(str(output), "already exists; pass --resume to continue it or --overwrite to start again")
    held = Journal(journal)  # locked before anything is read, cut or removed
    try:
        if overwrite:
            held.replace([])
            if output != journal:
                output.unlink(missing_ok=True)
            return Sink(output, fmt, held, [])
        rows = held.rows(_batch_row)
        if not rows and output != journal and output.exists():  # a finished CSV/Parquet run: carry its rows into the journal
            rows = read_final(output, fmt)
            held.replace({c: r.get(c) for c in COLUMNS} for r in rows)
        return Sink(output, fmt, held, rows)
    except BaseException:
        held.close()
        raise
