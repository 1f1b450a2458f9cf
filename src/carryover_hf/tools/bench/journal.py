"""The run journal of a benchmark: every finished prompt group on disk, so that a long run survives its session.

A *prompt group* is one prompt at one temperature with every method run on it back to back (the unit the report
pairs). `run_benchmark` appends each group to `<output_dir>/runs.jsonl` as soon as it is done, after a header line
that fingerprints what is being measured (settings, methods, prompt tokens, target and drafter weights, threads,
CPU kernels). Rerunning the same command with `--resume` skips the groups already there and measures the rest; a
journal of a different benchmark is refused with the fields that differ, so runs of two setups never mix.

Lines:

* `{"journal": SCHEMA, "fingerprint": ..., "measures": {...}}`: the header, once;
* `{"segment": k, "started": ..., "command": ...}`: each invocation that measured (a run spread over sessions has
  several; methods of a group always run within one, so paired ratios never cross machines' moods);
* `{"group": {...}}`: a finished prompt group (its `PromptRun`s and, at temperature 0, the target's tokens).

A line cut off by a killed process is dropped on reading (it is the group that was being written; it is measured
again), anything else that does not parse is an error.

Several processes may fill one journal side by side (`carryover-hf bench --shard K/N`, each measuring its own share
of the prompt groups): reading, truncating and appending hold an exclusive lock on the file (POSIX `flock`), each
process numbers its segment by the segment lines already there, and `refresh` reads the others' groups back before a
report is written.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from ...utils import json_fingerprint

try:
    import fcntl
except ImportError:  # not POSIX: one process per journal
    fcntl = None

SCHEMA = "carryover-hf-bench-journal/1"
FILE_NAME = "runs.jsonl"


class JournalError(ValueError):
    """A journal that belongs to another benchmark, or is damaged."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[IO[bytes]]:
    """The journal file opened for reading and writing (binary), under an exclusive lock for the block (other
    processes sharing the journal wait)."""
    with open(path, "rb+") as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield handle
        finally:
            if fcntl is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def parallel_journals_supported() -> bool:
    """Whether several processes may share a journal here (file locks: POSIX only)."""
    return fcntl is not None


class RunJournal:
    """`<output_dir>/runs.jsonl`: open it with `RunJournal.open(...)`, then `record(group)` after each group."""

    def __init__(self, path: Path, measures: Mapping[str, Any], groups: dict, segments: list[dict]):
        self.path = path
        self.measures = dict(measures)
        self.groups = groups  # (temperature, prompt_id) -> group dict, the finished ones
        self.segments = segments
        self._segment: int | None = None  # this process's segment number, once it has one

    @staticmethod
    def check_can_open(output_dir: str | os.PathLike, resume: bool = False, overwrite: bool = False) -> None:
        """The cheap part of `open`'s checks, for before models are loaded."""
        path = Path(output_dir) / FILE_NAME
        if path.is_file() and not (resume or overwrite):
            raise JournalError(
                f"{path} already holds a benchmark run; pass --resume to continue it (same command) or "
                "--overwrite to measure again from scratch, or choose another --output_dir."
            )
        if path.exists() and not path.is_file():
            raise JournalError(f"{path} is not a file; choose another --output_dir.")

    @classmethod
    def open(
        cls, output_dir: str | os.PathLike, measures: Mapping[str, Any], resume: bool = False, overwrite: bool = False
    ) -> "RunJournal":
        """The journal of `output_dir` for a benchmark that `measures` describes.

        A journal already there is continued with `resume` (if it measures the same thing), replaced with `overwrite`
        and otherwise refused, so that finished measurements are never thrown away by accident.
        """
        cls.check_can_open(output_dir, resume, overwrite)
        path = Path(output_dir) / FILE_NAME
        measures = json.loads(json.dumps(dict(measures), default=str))  # the form it takes on disk
        header = {"journal": SCHEMA, "created": _now(), "fingerprint": json_fingerprint(measures), "measures": measures}
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume:
            # A new journal; with --resume another shard may create it at the same moment. The header is written to
            # a scratch file first and linked into place, so the journal appears whole or not at all (a shard that
            # finds it a moment after another created it never reads an empty file).
            scratch = path.with_name(f".{path.name}.{os.getpid()}.new")
            scratch.write_text(json.dumps(header) + "\n")
            try:
                os.link(scratch, path)
            except FileExistsError:
                return cls._read(path, measures)
            finally:
                scratch.unlink()
            return cls(path, measures, {}, [])
        path.write_text(json.dumps(header) + "\n")
        return cls(path, measures, {}, [])

    @classmethod
    def _read(cls, path: Path, measures: Mapping[str, Any]) -> "RunJournal":
        with _locked(path) as handle:  # read only: a cut-off last line goes when this process first records
            complete = _whole_lines(handle, cut_tail=False)
        header = _header(path, complete)
        if header["fingerprint"] != json_fingerprint(measures):
            theirs = header["measures"]
            differ = sorted(k for k in set(theirs) | set(measures) if theirs.get(k) != measures.get(k))
            raise JournalError(
                f"{path} measures another benchmark (different {', '.join(differ)}); --resume continues only the "
                "same command on the same models. Use another --output_dir, or --overwrite to start again."
            )
        segments, group_list = _entries(path, complete)
        groups = {(float(g["temperature"]), g["prompt_id"]): g for g in group_list}
        return cls(path, header["measures"], groups, segments)

    def refresh(self) -> None:
        """Read back the groups that other processes sharing this journal have recorded since it was opened."""
        with _locked(self.path) as handle:
            complete = _whole_lines(handle, cut_tail=False)
        segments, group_list = _entries(self.path, complete)
        self.segments = segments
        self.groups = {(float(g["temperature"]), g["prompt_id"]): g for g in group_list}

    def done(self, temperature: float, prompt_id: str) -> dict | None:
        return self.groups.get((float(temperature), prompt_id))

    def record(self, group: Mapping[str, Any], command: str | None = None, machine: str | None = None) -> None:
        """Append a finished prompt group (and, before the first one of this invocation, a segment line with the
        command and the machine that timed it)."""
        with _locked(self.path) as handle:
            end = handle.seek(0, os.SEEK_END)
            handle.seek(max(end - 1, 0))
            # Read whole only when needed: a cut-off tail to remove, or this process's first segment line to number.
            complete = _whole_lines(handle) if handle.read(1) != b"\n" or self._segment is None else None
            entries = []
            if self._segment is None:
                # Numbered after the segment lines already there (a shard running beside this one may have added one).
                number = 1 + len(_entries(self.path, complete)[0])
                segment = {"segment": number, "started": _now(), "command": command, "machine": machine}
                self.segments.append(segment)
                entries.append(segment)
                self._segment = number
            group = {**group, "finished": _now(), "segment": self._segment}
            entries.append({"group": group})
            handle.seek(0, os.SEEK_END)
            handle.write("".join(json.dumps(e) + "\n" for e in entries).encode())
            handle.flush()
            os.fsync(handle.fileno())
        self.groups[(float(group["temperature"]), group["prompt_id"])] = group


def _split_text(text: str) -> tuple[list[str], str]:
    lines = text.split("\n")
    return lines[:-1], lines[-1]  # a whole line ends in a newline; the tail is a cut-off write


def _whole_lines(handle: IO[bytes], cut_tail: bool = True) -> list[str]:
    """The whole lines of a locked journal; a cut-off last line (a process killed while writing a group: that group
    is measured again) is removed from the file with `cut_tail`."""
    handle.seek(0)
    data = handle.read()
    complete, tail = _split_text(data.decode())
    if tail and cut_tail:
        handle.truncate(len(data) - len(tail.encode()))
    return complete


def _header(path: Path, complete: list[str]) -> dict[str, Any]:
    try:
        header = json.loads(complete[0])
        assert header.get("journal") == SCHEMA
    except (IndexError, ValueError, AssertionError):
        raise JournalError(f"{path} is not a benchmark journal ({SCHEMA}); use another --output_dir.") from None
    return header


def _entries(path: Path, complete: list[str]) -> tuple[list[dict], list[dict]]:
    """The segment lines and the finished prompt groups, in journal order."""
    segments, groups = [], []
    for number, line in enumerate(complete[1:], start=2):
        if not line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            raise JournalError(f"{path}, line {number}, does not parse; the journal is damaged.") from None
        if "group" in entry:
            groups.append(entry["group"])
        elif "segment" in entry:
            segments.append(entry)
    return segments, groups


def read_journal(path: str | os.PathLike) -> tuple[dict[str, Any], list[dict], list[dict]]:
    """A journal's header, segment lines and finished prompt groups, read only (for analyses of a run: a cut-off last
    line is left out here and left in place)."""
    path = Path(path)
    complete, _ = _split_text(path.read_text())
    return (_header(path, complete), *_entries(path, complete))


__all__ = ["FILE_NAME", "JournalError", "RunJournal", "parallel_journals_supported", "read_journal"]
