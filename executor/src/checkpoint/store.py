"""Namespace checkpoints: the module `_flowrepl_checkpoint_store` (the package's face to the Rust
side, `executor/src/checkpoint/state.rs`), loaded on the first checkpoint or restore (never on a
kernel's start).

# The package
The loader (executor/src/support.rs, `CHECKPOINT`) compiles each module from the source embedded
in the binary and then gives it the modules before it as globals, in this order (none is in
`sys.modules`, so a cell cannot import or replace them):
- picklable.py: what can be saved, and how a pickle refers to other names (with flowrepl's
  own cloudpickle, set there);
- files.py: the directory's segment files and journal lines (the format);
- graph.py: which names are pickled together, and the order to load them in;
- restore.py: loading a checkpoint into a namespace;
- store.py (here): `Store`, the automatic checkpoint kept in step with the namespace
  (incremental saves, compaction), and named checkpoints.
Unit tests: executor/tests/python/test_checkpoint_*.py, one file per module.
"""

import io
import json
import os
import pickle
import shutil
import sys
import time
import types

# Set by the loader once this module has run (executor/src/support.rs, `CHECKPOINT`); used only
# inside functions.
files = graph = picklable = restore = None

_dumps = pickle.dumps

# Journal lines, or segment files, after which a checkpoint compacts (one segment, and the
# journal rewritten as one full line).
MAX_LINES = 256
MAX_SEGMENTS = 64
# Values with more bytes than this (arrays: `nbytes`) are pickled straight into the segment.
WRITE_DIRECT = 16 << 20


class Store:
    """The automatic checkpoint of one session (`<task>.checkpoints/auto`), kept in step with the
    namespace: which names are saved where, and the objects they held when saved (strong
    references, so that a rebinding is seen by identity; let go when rebound, deleted, or at
    the end of the session)."""

    def __init__(self, ns, directory, max_bytes, verify_bytes):
        self.ns = ns
        self.dir = directory
        self.max_bytes = max_bytes
        self.verify_bytes = verify_bytes
        self.cls, self.pickler_name, self.by_value = picklable.pickler()
        self.pickler_class = picklable.pickler_class(self.cls, ns)
        self.session = None  # the session id written into journal lines (set by the kernel)
        self._reset()

    def _reset(self):
        self.groups = {}  # name -> files.Group (one object shared by the group's names)
        self.saved = {}  # name -> the object saved (or the module)
        # name -> id of an object that could not be saved: not kept alive (an open file must
        # still be closed when the session drops it), not tried again unless rebound.
        self.unsaved_ids = {}
        self.modules = {}  # name -> module name
        self.unsaved = {}  # name -> reason
        self.by_id = {}  # id of a saved object whose identity matters -> its name
        self.shared = {}  # id of an object inside a saved group -> that group
        self.segments = {}  # segment -> bytes of it that live groups use
        self.files = None  # segment -> its size on disk (read from the folder once)
        self.lines = 0
        self.seq = None
        self.started = False

    # ---- saving

    def _line(self, full, execution_count, groups, modules, unsaved, drop, context, ms=None):
        return files.journal_line(
            full, execution_count, self.pickler_name, self.session, groups, modules, unsaved, drop, context, ms
        )

    def _pickle(self, values, out):
        return picklable.dump(self.pickler_class, values, self.by_id, out)

    def _pickle_names(self, names, modules, unsaved, pickled, seg):
        """Pickles each name on its own into `pickled` (name -> (bytes, names used, ids); a
        large array goes straight into the segment `seg`, and its bytes are (offset,
        length) there), or files it under `modules` or `unsaved` (name -> reason)."""
        ns = self.ns
        for n in names:
            v = ns[n]
            t = type(v)
            if t in picklable.SCALARS:
                # Numbers and strings: nothing to share or refer to, nothing that fails.
                data = _dumps({n: v}, 5)
                if len(data) > self.max_bytes:
                    unsaved[n] = picklable.over(len(data), self.max_bytes)
                else:
                    pickled[n] = (data, (), {})
                continue
            if t is types.ModuleType:
                modules[n] = v.__name__
                continue
            why = picklable.why_not(v)
            if (
                why is None
                and not self.by_value
                and isinstance(v, (type, types.FunctionType))
                and getattr(v, "__module__", None) == "__main__"
            ):
                why = "functions and classes defined in the session are saved by value with flowrepl's cloudpickle, which is not loaded here"
            nbytes = getattr(v, "nbytes", None)
            if why is None and isinstance(nbytes, int) and nbytes > self.max_bytes:
                why = picklable.over(nbytes, self.max_bytes)
            if why is not None:
                unsaved[n] = why
                continue
            direct = isinstance(nbytes, int) and nbytes > WRITE_DIRECT
            out = seg.file() if direct else io.BytesIO()
            start = out.tell()
            try:
                used, ids = self._pickle({n: v}, out)
            except Exception as e:
                unsaved[n] = f"cannot be pickled: {type(e).__name__}: {e}"
                if direct:
                    out.seek(start)
                    out.truncate()
                continue
            length = out.tell() - start
            if length > self.max_bytes:
                unsaved[n] = picklable.over(length, self.max_bytes)
                continue
            pickled[n] = ((start, length) if direct else out.getbuffer(), used, ids)

    def _joining(self, pickled, dirty):
        """Names not yet marked that must be saved with the marked ones: their groups share
        objects with a marked name, or references run in a circle through them."""
        ns = self.ns
        extra = set()
        for _, _, ids in pickled.values():
            for i in ids.keys() & self.shared.keys():
                extra.update(self.shared[i].names)

        def edges(n):
            if n in pickled:
                return pickled[n][1]
            g = self.groups.get(n)
            return g.refs if g is not None else ()

        for scc in graph.cycles(list(pickled), edges):
            extra.update(scc)
        more = set()
        for n in extra:
            g = self.groups.get(n)
            if g is not None:
                more.update(g.names)
        return {n for n in extra | more if n in ns and n not in dirty}

    def checkpoint(self, codes, full, execution_count, context, rebound=None, removed=None):
        """Saves what changed since the last checkpoint (everything when `full` or the first
        time): the names `rebound` (by identity; computed here when None), the names the
        cells' `codes` may have changed, and the groups these share objects with. `removed`:
        the names saved before that are gone. Returns a summary (a dict) for the kernel."""
        t0 = time.perf_counter()
        ns = self.ns
        dunder = picklable.dunder
        if self.started and not os.path.isdir(self.dir):
            # The folder was deleted under a running session: nothing saved is on disk.
            self._reset()
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        if self.files is None:
            self.files = files.segment_bytes(self.dir)
            self.seq = files.last_segment(self.files)
        full = full or not self.started
        if full:
            dirty = {n for n in ns if not dunder(n)}
            drop = []
            self.by_id = {}
        else:
            if rebound is None:
                rebound = [n for n, v in ns.items() if self.saved.get(n, picklable.MISSING) is not v]
                removed = [n for n in self.saved if n not in ns]
            dirty = {n for n in rebound if not dunder(n) and self.unsaved_ids.get(n) != id(ns[n])}
            more = picklable.touched(ns, codes)
            if more is None:
                dirty = {n for n in ns if not dunder(n)}
            else:
                dirty |= {n for n in more if not dunder(n)}
            drop = sorted(set(removed) | {n for n in self.unsaved_ids if n not in ns})
            for n in drop:
                self._unindex(n)
        # Every name of a group goes with any of its names.
        for n in list(dirty):
            g = self.groups.get(n)
            if g is not None:
                dirty.update(x for x in g.names if x in ns)
        # Objects that are names' values are saved as references to those names.
        for n in dirty:
            self._unindex(n)
        for n in sorted(dirty):
            v = ns[n]
            if picklable.identity_matters(v):
                self.by_id.setdefault(id(v), n)
        modules, unsaved, pickled = {}, {}, {}
        seg = files.Segment(self)
        try:
            put = self._save(dirty, full, modules, unsaved, pickled, seg)
        except BaseException:
            seg.discard()
            raise
        seg.close()
        # Names that refer to a name that could not be saved cannot be restored either.
        changed = True
        while changed:
            changed = False
            for g in put:
                if g.names[0] in unsaved:
                    continue
                bad = [r for r in g.refs if r in unsaved or (r not in dirty and r in self.unsaved)]
                if bad:
                    for x in g.names:
                        unsaved[x] = f"refers to {bad[0]!r}, which could not be saved"
                    changed = True
        put = [g for g in put if g.names[0] not in unsaved]
        text = self._line(
            full, execution_count, put, modules, unsaved, drop, context, round((time.perf_counter() - t0) * 1000, 3)
        )
        if full:
            files.replace(os.path.join(self.dir, files.JOURNAL), text)
            self.lines = 1
        else:
            files.append(os.path.join(self.dir, files.JOURNAL), text)
            self.lines += 1
        # The journal now says it: the state follows.
        if full:
            self.groups, self.modules, self.unsaved = {}, {}, {}
            self.saved, self.unsaved_ids, self.shared, self.segments = {}, {}, {}, {}
        for n in drop:
            self._forget(n)
            self.saved.pop(n, None)
            self.unsaved_ids.pop(n, None)
        for n in dirty:
            self._forget(n)
        for g in put:
            for x in g.names:
                self.groups[x] = g
            for i in g.ids:
                self.shared[i] = g
            self.segments[g.seg] = self.segments.get(g.seg, 0) + g.len
        self.modules.update(modules)
        self.unsaved.update(unsaved)
        for n in dirty:
            v = ns[n]
            if n in self.unsaved:
                self.saved.pop(n, None)
                self.unsaved_ids[n] = id(v)
            else:
                self.unsaved_ids.pop(n, None)
                self.saved[n] = v
        self.started = True
        if full:
            files.collect(self.dir, set(self.segments))
            self.files = {f: n for f, n in self.files.items() if f in self.segments}
        else:
            self._maybe_compact(execution_count, context)
        return {
            "checkpoint": os.path.basename(self.dir),
            "execution_count": execution_count,
            "saved": sorted(n for g in put for n in g.names),
            "modules": sorted(modules),
            "unsaved": unsaved,
            "dropped": drop,
            "bytes": sum(g.len for g in put),
            "full": full,
            "pickler": self.pickler_name,
            "ms": (time.perf_counter() - t0) * 1000,
        }

    def _save(self, dirty, full, modules, unsaved, pickled, seg):
        """Pickles the `dirty` names (adding to `dirty` the clean ones that must go with
        them) into `seg`; returns the groups written."""
        ns = self.ns
        self._pickle_names(sorted(dirty), modules, unsaved, pickled, seg)
        # Clean names join when they share objects with a saved one, or when references now
        # run in a circle through them; their whole groups join too.
        while not full:
            extra = self._joining(pickled, dirty)
            if not extra:
                break
            dirty |= extra
            for n in extra:
                self._unindex(n)
                if picklable.identity_matters(ns[n]):
                    self.by_id.setdefault(id(ns[n]), n)
            self._pickle_names(sorted(extra), modules, unsaved, pickled, seg)
        return self._write_groups(pickled, unsaved, seg)

    def _write_groups(self, pickled, unsaved, seg):
        """One group per set of names that share objects or refer to each other in a circle
        (`graph.groups`); their pickles go into the segment `seg`. Returns the groups
        written."""
        if not pickled:
            return []
        f = seg.file()
        put = []
        for names in graph.groups(pickled):
            if len(names) == 1:
                data, used, ids = pickled[names[0]]
                if isinstance(data, tuple):
                    # Written already (a large array).
                    put.append(files.Group(names, seg.name, data[0], data[1], set(used) - set(names), ids))
                    continue
                scalar = used == ()
            else:
                scalar = False
                buf = io.BytesIO()
                try:
                    used, ids = self._pickle({x: self.ns[x] for x in names}, buf)
                except Exception as e:
                    for x in names:
                        unsaved[x] = f"cannot be pickled with the names it shares objects with: {type(e).__name__}: {e}"
                    continue
                data = buf.getbuffer()
            if not scalar and len(data) <= self.verify_bytes:
                try:
                    picklable.unpickler(self.ns, self.ns.__getitem__)(data)
                except Exception as e:
                    for x in names:
                        unsaved[x] = f"its saved form does not load back: {type(e).__name__}: {e}"
                    continue
            off = f.tell()
            f.write(data)
            put.append(files.Group(names, seg.name, off, len(data), set(used) - set(names), ids))
        return put

    def _unindex(self, name):
        """`name`'s old value is no longer a reference target."""
        old = self.saved.get(name, picklable.MISSING)
        if old is not picklable.MISSING and self.by_id.get(id(old)) == name:
            del self.by_id[id(old)]

    def _forget(self, name):
        g = self.groups.pop(name, None)
        if g is not None and not any(self.groups.get(x) is g for x in g.names):
            left = self.segments.get(g.seg, 0) - g.len
            if left > 0:
                self.segments[g.seg] = left
            else:
                self.segments.pop(g.seg, None)
            for i in g.ids:
                if self.shared.get(i) is g:
                    del self.shared[i]
        self.modules.pop(name, None)
        self.unsaved.pop(name, None)

    def _maybe_compact(self, execution_count, context):
        """Compacts when the journal is long, segments are many, or most of their bytes are
        dead."""
        live = sum(self.segments.values())
        dead = sum(self.files.values()) - live
        if self.lines >= MAX_LINES or len(self.files) > MAX_SEGMENTS or dead > max(live, 1 << 20):
            self._compact(execution_count, context)

    def _compact(self, execution_count, context):
        """Copies the live pickles into one new segment and rewrites the journal as one full
        line; then removes the old segments."""
        self.seq += 1
        seg_name = files.segment_name(self.seq)
        groups = list({id(g): g for g in self.groups.values()}.values())
        sources = {}
        try:
            with open(os.path.join(self.dir, seg_name), "wb") as out:
                for g in groups:
                    src = sources.get(g.seg)
                    if src is None:
                        src = sources[g.seg] = open(os.path.join(self.dir, g.seg), "rb")
                    src.seek(g.off)
                    data = src.read(g.len)
                    off = out.tell()
                    out.write(data)
                    g.seg, g.off = seg_name, off
        finally:
            for src in sources.values():
                src.close()
        text = self._line(True, execution_count, groups, self.modules, self.unsaved, [], context)
        files.replace(os.path.join(self.dir, files.JOURNAL), text)
        self.lines = 1
        self.segments = {seg_name: sum(g.len for g in groups)} if groups else {}
        self.files = {seg_name: sum(g.len for g in groups)}
        files.collect(self.dir, set(self.segments))

    def release(self):
        """Lets go of the session's objects (at the end of the session, or when its namespace
        is emptied): the next checkpoint saves every name."""
        self.saved, self.unsaved_ids, self.by_id, self.shared = {}, {}, {}, {}
        for g in self.groups.values():
            g.ids = {}
        self.started = False

    def checkpoint_json(self, codes, full, execution_count, context, rebound=None, removed=None):
        """`checkpoint` for the Rust side: the summary as JSON text."""
        return json.dumps(self.checkpoint(codes, full, execution_count, context, rebound, removed))

    # ---- restoring

    def restore_json(self, state_json, segments_dir):
        """`restore` for the Rust side: `state_json` is the folded checkpoint. The task's
        context becomes the checkpoint's only when the task has none (the task log, which
        every change reaches, keeps the newest)."""
        state = json.loads(state_json)
        restored, lost = self.restore(state, segments_dir)
        ctx = state.get("context")
        if ctx is not None:
            try:
                current = sys.modules["flowrepl"].flow.context
                saved = json.loads(ctx)
                if saved and not current._data:
                    current.update(saved, merge=False)
            except Exception as e:
                lost["flow.context"] = f"the task's context was not restored: {type(e).__name__}: {e}"
        return restored, lost

    def restore(self, state, segments_dir):
        """Loads a folded checkpoint (`state`, from the Rust reader) into the namespace, which
        the caller emptied (`restore.load`). Returns (restored names, {lost name: reason}).
        When the checkpoint is this store's own directory, the store continues from it (the
        next checkpoint is incremental)."""
        ns = self.ns
        restored, lost, ok_groups = restore.load(ns, state, segments_dir)
        if ok_groups is not None and os.path.abspath(segments_dir) == os.path.abspath(self.dir):
            self._reset()
            self.started = True
            for g in ok_groups:
                grp = files.Group(list(g["names"]), g["seg"], g["off"], g["len"], set(g["refs"]), {})
                for n in grp.names:
                    self.groups[n] = grp
                self.segments[grp.seg] = self.segments.get(grp.seg, 0) + grp.len
            self.modules = {n: m for n, m in state["modules"].items() if n in ns}
            self.unsaved = dict(state["unsaved"])
            self.saved = {n: ns[n] for n in restored if n in ns}
            for n in self.saved:
                if n not in self.modules and picklable.identity_matters(ns[n]):
                    self.by_id.setdefault(id(ns[n]), n)
            self.lines = MAX_LINES  # the next checkpoint compacts the journal
        return sorted(restored), lost


def context():
    """The task's context as JSON text (what `flow.context` holds), or None."""
    try:
        return json.dumps(sys.modules["flowrepl"].flow.context._data)
    except Exception:
        return None


def save_named_json(ns, directory, max_bytes, verify_bytes, execution_count, context, session=None):
    """`save_named` for the Rust side: the summary as JSON text."""
    return json.dumps(save_named(ns, directory, max_bytes, verify_bytes, execution_count, context, session))


def save_named(ns, directory, max_bytes, verify_bytes, execution_count, context, session=None):
    """A named checkpoint: everything, into its own directory, replacing what was there only
    once the new one is whole."""
    parent = os.path.dirname(directory)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    tmp = directory + ".%d.tmp" % os.getpid()
    shutil.rmtree(tmp, ignore_errors=True)
    store = Store(ns, tmp, max_bytes, verify_bytes)
    store.session = session
    summary = store.checkpoint([], True, execution_count, context)
    old = directory + ".%d.old" % os.getpid()
    if os.path.exists(directory):
        os.rename(directory, old)
    os.rename(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)
    summary["checkpoint"] = os.path.basename(directory)
    return summary
