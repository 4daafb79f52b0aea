"""The prepared-input store: every video of a preference set run once through the exact contract, on disk.

Training at the release's scale (about 312K pairs) cannot hold prepared videos in memory (about
0.46 MB per frame), and should not decode every video again every epoch. ``nvrm prefs prepare``
writes the contract's output once; training (on any rank of any machine that sees the folder)
reads each video's patches when its pair comes up.

Layout of a store folder:

    store.json                   format, version, the preprocessing fingerprint it was built with
    shard-<id>.safetensors       uint8 (or float32) patches and grids of many videos, by key
    shard-<id>.index.json        per video: key, role, source path, its size and mtime, sample times

- A key is the video's role and the sha256 of its content, so one file named twice is stored once.
- A shard is written under a temporary name, fsynced and renamed; its index is renamed last, and
  only shards with an index count. A build that is killed loses at most its open shard, and a
  rebuild skips every video already stored (resumable). Several builders (Ray tasks) may write
  shards into one folder at once: shard ids are unique.
- A store records the preprocessing fingerprint (the contract plus the bundle's processor,
  tokenizer and template files); a model with another fingerprint refuses it in one line.
- So does every shard, in its index and in its safetensors header: a shard copied in from a store
  of another contract is never read. Each shard with an index is checked when the store is read
  (its fingerprint, its header, its size against the header, the tensors its index names); the
  videos of a damaged or foreign shard count as not stored, so a rebuild prepares them again and a
  reader names the shard and the reason.
- Never pickle: safetensors and JSON only.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

from ..errors import InputError
from ..video.inputs import PreparedVideo

FORMAT = "nvrm-prepared-store"
VERSION = 1
SHARD_BYTES = 256 << 20
"""A shard is closed once it holds this many bytes of patches."""


def content_key(path: str | os.PathLike, role: str) -> str:
    """``role:sha256`` of the file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"{role}:{h.hexdigest()}"


def _stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _tensor_name(key: str, part: str) -> str:
    return f"{key.replace(':', '.')}.{part}"


@dataclass(frozen=True)
class StoreEntry:
    """One stored video."""

    key: str
    role: str
    path: str
    size: int
    mtime_ns: int
    times: tuple[float, ...]
    shard: str


def _atomic_json(path: Path, body: Any) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


class StoreWriter:
    """Adds prepared videos to a store folder, one shard at a time (thread-safe)."""

    def __init__(self, folder: str | os.PathLike, fingerprint: str, shard_bytes: int = SHARD_BYTES, contract: str | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        meta = self.folder / "store.json"
        if meta.is_file():
            check_meta(self.folder, fingerprint)
        else:
            _atomic_json(meta, {"format": FORMAT, "version": VERSION, "fingerprint": fingerprint})
        self.fingerprint = fingerprint
        self.contract = contract
        self.shard_bytes = shard_bytes
        self._tensors: dict[str, torch.Tensor] = {}
        self._entries: list[dict[str, Any]] = []
        self._bytes = 0
        self._lock = threading.Lock()
        self.shards_written = 0

    def add(self, key: str, path: str, video: PreparedVideo) -> None:
        """Buffer ``video`` (prepared and encoded) under ``key``; a full buffer is written as a shard."""
        if video.pixels is None:
            raise ValueError(f"{path}: the video is not encoded (no patches)")
        size, mtime = _stat(path)
        pixels = video.pixels.contiguous()
        with self._lock:
            self._tensors[_tensor_name(key, "pixels")] = pixels
            self._tensors[_tensor_name(key, "grid")] = video.grid.to(torch.int64).contiguous()
            self._entries.append({"key": key, "role": video.role, "path": path, "size": size, "mtime_ns": mtime, "times": list(video.times)})
            self._bytes += pixels.numel() * pixels.element_size()
            full = self._bytes >= self.shard_bytes
        if full:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered as one shard (nothing if the buffer is empty)."""
        from safetensors.torch import save_file

        with self._lock:
            tensors, entries = self._tensors, self._entries
            self._tensors, self._entries, self._bytes = {}, [], 0
        if not entries:
            return
        shard = f"shard-{uuid.uuid4().hex[:16]}"
        tmp = self.folder / f".{shard}.safetensors.tmp"
        stamp = {"fingerprint": self.fingerprint, **({"contract": self.contract} if self.contract else {})}
        save_file(tensors, str(tmp), metadata={"format": FORMAT, **stamp})
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.folder / f"{shard}.safetensors")
        _atomic_json(self.folder / f"{shard}.index.json", {"shard": shard, "entries": entries, **stamp})
        self.shards_written += 1

    def close(self) -> None:
        self.flush()


def check_meta(folder: Path, fingerprint: str) -> dict[str, Any]:
    """The store's ``store.json``, refused (one line) when it is not a store or was built for other preprocessing."""
    path = Path(folder) / "store.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(str(folder), f"is not a prepared-input store (store.json: {' '.join(str(e).split())[:120]}); build one with nvrm prefs prepare") from e
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise InputError(str(folder),
                         f"is not a version-{VERSION} prepared-input store (store.json says {meta.get('format')!r} version {meta.get('version')!r})")
    if meta.get("fingerprint") != fingerprint:
        raise InputError(
            str(folder),
            f"was built with preprocessing {str(meta.get('fingerprint'))[:12]}, and this model's is {fingerprint[:12]} (another contract, "
            "processor, tokenizer or template); build a store for this bundle with nvrm prefs prepare",
        )
    return meta


def _read_header(path: Path) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(where the data starts, the tensor table, the metadata) of a safetensors file's header."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if not 0 < n <= 64 << 20:
            raise ValueError(f"header of {n} bytes")
        table = json.loads(f.read(n))
    if not isinstance(table, dict):
        raise ValueError("the header is not a JSON object")
    meta = table.pop("__metadata__", None)
    return 8 + n, table, meta if isinstance(meta, dict) else {}


def _stamp_problem(what: str, stamp: dict[str, Any], fingerprint: str | None, contract: str | None) -> str | None:
    """Why a shard's recorded fingerprint (in its index or its header) is not this store's (None: it is)."""
    if fingerprint is not None and stamp.get("fingerprint") != fingerprint:
        if not stamp.get("fingerprint"):
            return f"records no preprocessing fingerprint in its {what} (an older nvrm wrote it, or it was copied in)"
        return (f"was built with preprocessing {str(stamp['fingerprint'])[:12]} ({what}), and this store's is {fingerprint[:12]} "
                "(copied in from a store of another contract, processor, tokenizer or template)")
    if contract is not None and stamp.get("contract") not in (None, contract):
        return f"was built for contract {str(stamp['contract'])[:12]} ({what}), and this store's is {contract[:12]}"
    return None


def shard_problem(folder: Path, body: dict[str, Any], fingerprint: str | None, contract: str | None = None) -> str | None:
    """Why the shard an index ``body`` describes cannot be read (None: it can): another store's, or damaged."""
    problem = _stamp_problem("index", body, fingerprint, contract)
    if problem:
        return problem
    path = Path(folder) / f"{body['shard']}.safetensors"
    try:
        start, table, meta = _read_header(path)
        size = path.stat().st_size
        end = max((int(t["data_offsets"][1]) for t in table.values()), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        return f"is unreadable ({type(e).__name__}: {' '.join(str(e).split())[:120]})"
    if size != start + end:
        return f"is truncated or damaged ({size} bytes, and its header describes {start + end})"
    problem = _stamp_problem("header", meta, fingerprint, contract)
    if problem:
        return problem
    lacking = [e["key"] for e in body["entries"] if not {_tensor_name(e["key"], "pixels"), _tensor_name(e["key"], "grid")} <= table.keys()]
    return f"lacks the tensors of {len(lacking)} video(s) its index names ({lacking[0]})" if lacking else None


def _store_fingerprint(folder: Path) -> str | None:
    try:
        return json.loads((Path(folder) / "store.json").read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def scan(folder: Path, contract: str | None = None) -> tuple[dict[tuple[str, str], StoreEntry], dict[tuple[str, str], str]]:
    """(absolute path, role) -> its entry, from every complete, sound shard of this store (the newest wins); and
    (path, role) -> why, for the videos stored only in a shard that cannot be used (damaged, or another store's)."""
    folder = Path(folder)
    fingerprint = _store_fingerprint(folder)
    out: dict[tuple[str, str], StoreEntry] = {}
    lost: dict[tuple[str, str], str] = {}
    for index in sorted(folder.glob("shard-*.index.json"), key=lambda p: p.stat().st_mtime_ns):
        try:
            body = json.loads(index.read_text())
            entries = [StoreEntry(e["key"], e["role"], e["path"], e["size"], e["mtime_ns"], tuple(e["times"]), body["shard"])
                       for e in body["entries"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InputError(str(index),
                             f"is unreadable ({' '.join(str(e).split())[:120]}); delete it and its shard, then rebuild (nvrm prefs prepare resumes)") from e
        own = index.name[: -len(".index.json")]
        problem = shard_problem(folder, body, fingerprint, contract) if body["shard"] == own else f"is named by {index.name}, not by its own index"
        for entry in entries:
            if problem is None:
                out[(entry.path, entry.role)] = entry
            else:
                lost[(entry.path, entry.role)] = f"shard {folder / (entry.shard + '.safetensors')} {problem}"
    return out, {k: v for k, v in lost.items() if k not in out}


def read_entries(folder: Path) -> dict[tuple[str, str], StoreEntry]:
    """(absolute path, role) -> its entry, from every complete and sound shard's index (the newest wins; see ``scan``)."""
    return scan(folder)[0]


class StoreReader:
    """Prepared videos from a store, by the path and role a pair names them with (thread-safe).

    Only the indices are read up front; a video's patches are read from its shard when it is asked
    for (``pread``, not a memory map, so no shard stays resident), and memory stays flat however large
    the store is.
    """

    def __init__(self, folder: str | os.PathLike, fingerprint: str, contract: str):
        self.folder = Path(folder)
        check_meta(self.folder, fingerprint)
        self.fingerprint = fingerprint
        self.contract = contract
        self.entries, self.lost = scan(self.folder, contract)
        self._handles: "OrderedDict[str, tuple[int, dict[str, Any]]]" = OrderedDict()  # shard -> its header
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.entries)

    def missing(self, wanted: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """The (path, role)s not in the store, or changed since it was built (size or mtime)."""
        out = []
        for path, role in wanted:
            e = self.entries.get((os.path.abspath(path), role))
            if e is None:
                out.append((path, role))
                continue
            try:
                if _stat(e.path) != (e.size, e.mtime_ns):
                    out.append((path, role))
            except OSError:
                pass  # a store may outlive its source files: the stored video is what is read
        return out

    def why_missing(self, path: str, role: str) -> str:
        """Why the video at ``path`` (as a ``role``) cannot be read from this store: one line naming it and the fix."""
        lost = self.lost.get((os.path.abspath(path), role))
        if lost is not None:
            return f"{path} is stored only in an unusable {lost}; rebuild the store (nvrm prefs prepare resumes)"
        return f"{path} is not in the prepared-input store as a {role} (or changed since); rebuild it"

    def _header(self, shard: str) -> tuple[int, dict[str, Any]]:
        """(where the data starts, the tensor table) of a shard's safetensors header (cached; a few KB each)."""
        with self._lock:
            hit = self._handles.get(shard)
            if hit is not None:
                self._handles.move_to_end(shard)
                return hit
        start, table, meta = _read_header(self.folder / f"{shard}.safetensors")
        problem = _stamp_problem("header", meta, self.fingerprint, self.contract)  # checked when read, not only at the root
        if problem:
            raise ValueError(problem)
        with self._lock:
            self._handles[shard] = (start, table)
            while len(self._handles) > 4096:
                self._handles.popitem(last=False)
        return start, table

    def _read(self, shard: str, name: str) -> torch.Tensor:
        """One tensor read with ``pread`` into memory of its own: no memory map keeps the shard's pages resident."""
        start, table = self._header(shard)
        spec = table[name]
        begin, end = spec["data_offsets"]
        buf = bytearray(end - begin)
        fd = os.open(self.folder / f"{shard}.safetensors", os.O_RDONLY)
        try:
            got = os.preadv(fd, [buf], start + begin)
        finally:
            os.close(fd)
        if got != len(buf):
            raise ValueError(f"{name}: {got} of {len(buf)} bytes")
        dtype = {"U8": torch.uint8, "I64": torch.int64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[spec["dtype"]]
        return torch.frombuffer(buf, dtype=dtype).reshape(spec["shape"]) if buf else torch.empty(spec["shape"], dtype=dtype)

    def get(self, path: str, role: str) -> PreparedVideo:
        """The stored prepared video (patches, grid and times; no images: training needs none)."""
        e = self.entries.get((os.path.abspath(path), role))
        if e is None:
            raise InputError(path, f"is not in the prepared-input store {self.folder} as a {role}; rebuild it (nvrm prefs prepare resumes)")
        try:
            pixels = self._read(e.shard, _tensor_name(e.key, "pixels"))
            grid = self._read(e.shard, _tensor_name(e.key, "grid"))
        except Exception as err:  # noqa: BLE001 - a damaged shard: one line naming it and the fix
            raise InputError(str(self.folder / f"{e.shard}.safetensors"),
                             f"is unreadable ({type(err).__name__}: {' '.join(str(err).split())[:120]}); delete it and its index, then rebuild") from err
        return PreparedVideo((), e.times, os.path.basename(path), role, self.contract, pixels, grid)


def pending(videos: Iterable[tuple[str, str]], folder: str | os.PathLike) -> tuple[list[tuple[str, str]], int]:
    """(the absolute (path, role)s of ``videos`` not stored yet, or changed since; how many are stored already)."""
    have = read_entries(Path(folder))
    todo, skipped = [], 0
    for path, role in dict.fromkeys((os.path.abspath(p), r) for p, r in videos):
        e = have.get((path, role))
        try:
            current = _stat(path)
        except OSError:
            current = None
        if e is not None and (current is None or current == (e.size, e.mtime_ns)):
            skipped += 1
        else:
            todo.append((path, role))
    return todo, skipped


def build_store(model, videos: Iterable[tuple[str, str]], folder: str | os.PathLike, *, shard_bytes: int = SHARD_BYTES, on_error=None,
                say=None) -> dict[str, Any]:
    """Prepare every (path, role) of ``videos`` not stored yet, through ``model``'s engine, into ``folder``.

    Returns counts: ``stored`` (now), ``skipped`` (already there), ``failed`` (each failure goes to
    ``on_error(path, role, error)``; nothing is stored for it). A video stored only in a damaged or
    foreign shard is prepared again (``say`` hears about each such shard once).
    """
    from ..errors import NvrmError

    writer = StoreWriter(folder, model.fingerprint, shard_bytes, contract=model.contract.fingerprint)
    if say is not None:
        for why in sorted(set(scan(Path(folder))[1].values())):
            say(f"nvrm: prepared-input store: {why}; its videos are prepared again")
    todo, skipped = pending(videos, folder)
    stored = failed = 0
    window = max(8, 4 * model.engine.workers)
    for start in range(0, len(todo), window):
        part = todo[start : start + window]
        tasks = [(p, r, model.engine.submit_video(p, r)) for p, r in part]
        for path, role, task in tasks:
            try:
                video = task.result()
                writer.add(content_key(path, role), path, video)
                stored += 1
            except (NvrmError, OSError) as err:
                failed += 1
                if on_error is not None:
                    on_error(path, role, err)
    writer.close()
    return {"stored": stored, "skipped": skipped, "failed": failed, "shards": writer.shards_written}
