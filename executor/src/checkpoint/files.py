"""A checkpoint directory's files: the module `_flowrepl_checkpoint_files` (part of the
checkpoint package, see store.py).

A checkpoint directory holds segment files (`s-NNNNNN.bin`, pickles back to back, never
rewritten) and `journal.jsonl`: one JSON line per checkpoint, each written with one `write`
after its segment, so a kill during a checkpoint leaves the lines before it whole (a torn last
line is ignored by the reader). A line says which names it saves (`put`, groups of names
pickled together), which names are modules (`modules`, restored by importing), which could not
be saved and why (`unsaved`) and which are gone (`drop`); a `full` line starts over. The Rust
side (flowrepl-task-logger's `checkpoint`) folds the lines into the checkpoint: one reader of the
format. See docs/checkpoints.md. Unit tests: executor/tests/python/test_checkpoint_files.py.
"""

import json
import os
import sys
import time

FORMAT = 1
JOURNAL = "journal.jsonl"


def python():
    """This interpreter's version as the journal names it ("3.11")."""
    return "%d.%d" % sys.version_info[:2]


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + ".%03dZ" % (time.time() % 1 * 1000)


class Group:
    """Names pickled together (they share objects, or refer to each other in a circle):
    where their pickle is, the other names it refers to, and the objects in it whose identity
    matters (by id, kept alive while the group is)."""

    __slots__ = ("names", "seg", "off", "len", "refs", "ids")

    def __init__(self, names, seg, off, length, refs, ids):
        self.names = names
        self.seg = seg
        self.off = off
        self.len = length
        self.refs = refs
        self.ids = ids

    def entry(self):
        """Its entry in a journal line's `put`."""
        return {"names": self.names, "seg": self.seg, "off": self.off, "len": self.len, "refs": sorted(self.refs)}


def journal_line(full, execution_count, pickler, session, groups, modules, unsaved, drop, context, ms=None):
    """The one writer of a journal line (read by `task-logger/src/checkpoint.rs`, `JournalLine`):
    its JSON text with the newline. `groups` are the pickle groups written (`Group`); `ms` the
    time it took, when known."""
    line = {
        "v": FORMAT,
        "full": full,
        "execution_count": execution_count,
        "time": _now(),
        "python": python(),
        "pickler": pickler,
        "session": session,
        "put": [g.entry() for g in groups],
        "modules": modules,
        "unsaved": unsaved,
        "drop": drop,
        "context": context,
    }
    if ms is not None:
        line["ms"] = ms
    return json.dumps(line, separators=(",", ":")) + "\n"


def segment_name(seq):
    """The file name of segment number `seq`."""
    return "s-%06d.bin" % seq


def segment_bytes(directory):
    """Segment file -> size."""
    out = {}
    with os.scandir(directory) as it:
        for e in it:
            if e.name.startswith("s-") and e.name.endswith(".bin"):
                out[e.name] = e.stat().st_size
    return out


def last_segment(files):
    """The highest segment number among `files` (0 for none)."""
    return max((int(f[2:-4]) for f in files if f[2:-4].isdigit()), default=0)


class Segment:
    """The segment file one checkpoint writes, made on first use: the next number after
    `store.seq`, its size recorded in `store.files` when closed."""

    def __init__(self, store):
        self.store = store
        self.f = None
        self.name = None

    def file(self):
        if self.f is None:
            self.store.seq += 1
            self.name = segment_name(self.store.seq)
            self.f = open(os.path.join(self.store.dir, self.name), "wb")
        return self.f

    def close(self):
        if self.f is not None:
            self.store.files[self.name] = self.f.tell()
            self.f.close()
            self.f = None

    def discard(self):
        if self.f is not None:
            self.f.close()
            self.f = None
            remove(os.path.join(self.store.dir, self.name))


def remove(path):
    """Removes a file if it is there."""
    try:
        os.unlink(path)
    except OSError:
        pass


def collect(directory, keep):
    """Removes segments the journal no longer uses, and temporary files of killed writes."""
    for entry in os.listdir(directory):
        if (entry.startswith("s-") and entry.endswith(".bin") and entry not in keep) or entry.endswith(".tmp"):
            remove(os.path.join(directory, entry))


def _write_all(fd, data):
    """Writes all of `data` or raises (a short write on a full disk included)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(28, "No space left on device (short write)")
        view = view[n:]


def append(path, text):
    """Appends one journal line whole, or not at all: a write cut short (a full disk) is cut
    back off, so the line before stays the last and the next append starts a line of its own."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        try:
            _write_all(fd, text.encode())
        except BaseException:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


def replace(path, text):
    """Replaces the file at `path` with `text` whole (a temporary file renamed over it)."""
    tmp = path + ".%d.tmp" % os.getpid()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, text.encode())
    except BaseException:
        os.close(fd)
        remove(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
