"""Where batch rows go: a durable JSONL journal, rendered to CSV or Parquet at the end.

Every write appends whole lines in one ``write`` call, then ``flush`` and
``fsync``. A job killed mid-write can leave at most one torn line at the end
of the file; on resume it is cut off (and its rows scored again), so the
output never has missing, duplicated or torn rows.

``.jsonl`` (or ``.json``) outputs are the journal itself. For ``.csv`` and
``.parquet`` the journal is ``OUTPUT.journal.jsonl``; when the job finishes
the final file is written to a temporary name and renamed into place, and the
journal is removed. Resuming a finished CSV/Parquet job reads its keys back
from the final file.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable

from ..errors import InputError, OutputError
from .manifest import Key

log = logging.getLogger(__name__)

COLUMNS = ("id", "candidate_index", "candidate", "reward", "error", "num_tokens", "contract", "model_revision", "off_contract")
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}


def output_format(path: Path) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputError(str(path), f"unknown output format {path.suffix or '(none)'}; use .jsonl, .csv or .parquet")
    return fmt


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def repair_journal(path: Path) -> list[dict[str, Any]]:
    """Rows of a journal, cutting off a torn last line in place."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        log.warning("%s: cutting a torn last line (%d bytes) left by an interrupted run", path, len(data) - end)
        with path.open("r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    rows = []
    for n, line in enumerate(data[:end].splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(str(path), f"line {n} is not valid JSON ({e.msg}); it was not written by nvrm batch") from e
        if not isinstance(row, dict) or "id" not in row or "candidate_index" not in row:
            raise InputError(str(path), f"line {n} is not an nvrm batch row (needs id and candidate_index)")
        rows.append(row)
    return rows


def read_final(path: Path, fmt: str) -> list[dict[str, Any]]:
    """Rows of a finished CSV or Parquet output."""
    if fmt == "csv":
        import pyarrow.csv as pcsv

        types = {"id": "string", "candidate": "string", "error": "string", "contract": "string", "model_revision": "string"}
        options = pcsv.ConvertOptions(column_types=types, strings_can_be_null=True, quoted_strings_can_be_null=False)
        table = pcsv.read_csv(path, convert_options=options)
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
    return table.to_pylist()


def key_of(row: dict[str, Any]) -> Key:
    return (str(row["id"]), int(row["candidate_index"]))


class Sink:
    """Appends rows durably; ``finish`` writes the final file for CSV/Parquet."""

    def __init__(self, output: Path, fmt: str, journal: Path, rows: list[dict[str, Any]]):
        self.output = output
        self.format = fmt
        self.journal = journal
        self.done: set[Key] = set()
        dup = 0
        for r in rows:
            k = key_of(r)
            dup += k in self.done
            self.done.add(k)
        if dup:
            raise InputError(str(journal), f"{dup} duplicated row(s) in the existing output; it was edited or not written by nvrm batch")
        created = not journal.exists()
        try:
            self._fh = journal.open("ab")
        except OSError as e:
            raise OutputError(str(journal), e.strerror or type(e).__name__) from e
        if created:
            _fsync_dir(journal.parent)

    def write(self, rows: Iterable[dict[str, Any]]) -> None:
        rows = list(rows)
        for r in rows:
            k = key_of(r)
            if k in self.done:  # a bug upstream must not duplicate a row
                raise RuntimeError(f"row {k} written twice")
            self.done.add(k)
        if not rows:
            return
        blob = "".join(json.dumps({c: r.get(c) for c in COLUMNS}, ensure_ascii=False) + "\n" for r in rows)
        try:
            self._fh.write(blob.encode("utf-8"))
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as e:  # a torn last line is cut by --resume; the rows before it stay
            raise OutputError(str(self.journal), e.strerror or type(e).__name__) from e

    def finish(self) -> None:
        try:
            self._finish()
        except OSError as e:
            raise OutputError(str(self.output), e.strerror or type(e).__name__) from e

    def _finish(self) -> None:
        self._fh.close()
        if self.format == "jsonl":
            return
        import pyarrow as pa

        rows = repair_journal(self.journal)
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
        _fsync_dir(self.output.parent)
        self.journal.unlink()

    def close(self) -> None:
        if not self._fh.closed:
            try:
                self._fh.close()
            except OSError:  # already reported by the write that failed
                pass


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def open_sink(output: str | Path, *, resume: bool = False, overwrite: bool = False, manifest: str | Path | None = None) -> Sink:
    """Open the output for appending; refuses to clobber unless ``resume`` or ``overwrite``,
    and refuses an output (or its journal) that is the job's own ``manifest``."""
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
    if overwrite:
        for p in {output, journal}:
            p.unlink(missing_ok=True)
        return Sink(output, fmt, journal, [])
    rows: list[dict[str, Any]] = []
    if journal.exists():
        rows = repair_journal(journal)
    elif output.exists():  # a finished CSV/Parquet job: carry its rows into a new journal
        rows = read_final(output, fmt)
        with journal.open("wb") as f:
            f.write("".join(json.dumps({c: r.get(c) for c in COLUMNS}) + "\n" for r in rows).encode())
            f.flush()
            os.fsync(f.fileno())
    return Sink(output, fmt, journal, rows)
