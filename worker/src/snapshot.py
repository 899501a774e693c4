"""Namespace checkpoints: the module `_flowrepl_snapshot`, loaded on the first checkpoint or
restore (never on a kernel's start).

A checkpoint directory holds segment files (`s-NNNNNN.bin`, pickles back to back, never
rewritten) and `journal.jsonl`: one JSON line per checkpoint, each written with one `write` after
its segment, so a kill during a checkpoint leaves the lines before it whole (a torn last line is
ignored by the reader). A line says which names it saves (`put`, groups of names pickled
together), which names are modules (`modules`, restored by importing), which could not be saved
and why (`unsaved`) and which are gone (`drop`); a `full` line starts over. The Rust side
(flowrepl-task-logger's `snapshot`) folds the lines into the checkpoint and hands the result to
`restore`: one reader of the format. See docs/snapshots.md.

Size: one job (the checkpoint format: writing it incrementally, compacting it, restoring from
it) in about 990 lines, most of them `Store`, whose methods share its bookkeeping of groups,
segments and held objects; unit tests in worker/tests/python/test_snapshot.py.

Each name is saved on its own, so one object that cannot be pickled costs only its name. Names
whose objects share sub-objects are pickled together, so sharing survives; an object that is the
value of another name is saved as a reference to that name ("persistent id"), so `b = a` and a
list holding another name's dict come back shared, and big values are not saved twice.
Functions and classes defined in the session are saved by value with flowrepl's own pinned
cloudpickle (`_cloudpickle` below), and restored functions see the live namespace, not a copy of
it.
"""

import builtins
import io
import json
import os
import pickle
import sys
import time
import types

_dumps = pickle.dumps

FORMAT = 1
JOURNAL = "journal.jsonl"
# Types whose identity never matters: not tracked for sharing, never saved as references.
_VALUE_TYPES = frozenset(
    {str, bytes, int, float, complex, bool, type(None), type(Ellipsis), tuple, frozenset, range}
)
# What pickling cannot carry, named before trying (the error messages of pickle are vaguer).
_NOT_SAVEABLE = (
    (types.GeneratorType, "a generator: its running frame cannot be saved"),
    (types.CoroutineType, "a coroutine: its running frame cannot be saved"),
    (types.AsyncGeneratorType, "an async generator: its running frame cannot be saved"),
    (types.FrameType, "a frame"),
    (types.TracebackType, "a traceback"),
    (io.IOBase, "an open file or stream: its OS handle cannot be saved"),
)
# Names a cell can use to change any variable without naming it: such a cell marks them all.
_WHOLE_NAMESPACE = frozenset({"globals", "exec", "eval", "vars", "__import__", "setattr"})
# Journal lines, or segment files, after which a checkpoint compacts (one segment, and the
# journal rewritten as one full line).
_MAX_LINES = 256
_MAX_SEGMENTS = 64
# Values with nothing to share or refer to: pickled on the fast path.
_SCALARS = frozenset({int, float, str, bytes, bool, type(None), complex})
# Pickles larger than this are unpickled from the segment file, not read into memory first.
_LOAD_FROM_FILE = 1 << 20
# Values with more bytes than this (arrays: `nbytes`) are pickled straight into the segment.
_WRITE_DIRECT = 16 << 20


# flowrepl's own cloudpickle (a pinned copy, compiled from the source embedded in the
# binary): set by the Rust side when it loads this module. It is in no `sys.modules` and on no
# `sys.path`, so a cell cannot import it and what can be restored does not depend on what the
# user installed. Its own helpers (the reconstructors a pickle names) are saved as persistent
# ids, never by a module name that would have to be importable at load time.
_cloudpickle = None
_CP_ID = "cp"


def _pickler():
    """(Pickler class, description, by value): flowrepl's cloudpickle, else plain pickle
    (which saves session functions and classes only by name)."""
    if _cloudpickle is not None:
        return _cloudpickle.Pickler, f"cloudpickle {_cloudpickle_version()} (flowrepl)", True
    return pickle.Pickler, "pickle", False


def _cloudpickle_version():
    return getattr(_cloudpickle, "__version__", "?")


def _cloudpickle_ids():
    """id -> name of the private cloudpickle's own functions and classes."""
    if _cloudpickle is None:
        return {}
    return {
        id(v): k
        for k, v in vars(_cloudpickle).items()
        if isinstance(v, (type, types.FunctionType)) and getattr(v, "__module__", None) == _cloudpickle.__name__
    }


def _python():
    return "%d.%d" % sys.version_info[:2]


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + ".%03dZ" % (time.time() % 1 * 1000)


def _identity_matters(obj):
    """False for values whose identity no code can rely on (numbers, strings, tuples), and
    for modules, classes and functions that pickle by name (defined outside the session)."""
    t = type(obj)
    if t in _VALUE_TYPES or t is types.ModuleType:
        return False
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        return getattr(obj, "__module__", None) == "__main__"
    return True


def _why_not(value):
    for kind, why in _NOT_SAVEABLE:
        if isinstance(value, kind):
            return why
    name = type(value).__name__
    if name in ("lock", "RLock", "_RLock", "Condition", "Semaphore", "Event"):
        return f"a thread synchronisation object ({name}): its state belongs to this process"
    if name in ("socket", "SSLSocket"):
        return "a socket: its OS handle cannot be saved"
    return None


def _code_names(code, into):
    into.update(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_names(const, into)


def touched(ns, codes):
    """The names the cells (`codes`, their compiled code) may have changed: the globals they
    name, and, through functions and classes defined in the session that they name, what
    those name in turn. None: every name (a cell that used globals(), exec, eval...)."""
    seen = set()
    for code in codes:
        _code_names(code, seen)
    if seen & _WHOLE_NAMESPACE:
        return None
    todo = [n for n in seen if n in ns]
    names = set(todo)
    while todo:
        value = ns.get(todo.pop())
        more = set()
        funcs = []
        if isinstance(value, types.FunctionType) and value.__globals__ is ns:
            funcs.append(value)
        else:
            cls = value if isinstance(value, type) else type(value)
            if cls.__module__ == "__main__":
                funcs.extend(f for f in vars(cls).values() if isinstance(f, types.FunctionType))
        for f in funcs:
            _code_names(f.__code__, more)
        if more & _WHOLE_NAMESPACE:
            return None
        for n in more:
            if n in ns and n not in names:
                names.add(n)
                todo.append(n)
    return names


class _Group:
    __slots__ = ("names", "seg", "off", "len", "refs", "ids")

    def __init__(self, names, seg, off, length, refs, ids):
        self.names = names
        self.seg = seg
        self.off = off
        self.len = length
        self.refs = refs
        self.ids = ids

    def entry(self):
        return {"names": self.names, "seg": self.seg, "off": self.off, "len": self.len, "refs": sorted(self.refs)}


class Store:
    """The automatic checkpoint of one session (`<task>.snapshot/auto`), kept in step with the
    namespace: which names are saved where, and the objects they held when saved (strong
    references, so that a rebinding is seen by identity; let go when rebound, deleted, or at
    the end of the session)."""

    def __init__(self, ns, directory, max_bytes, verify_bytes):
        self.ns = ns
        self.dir = directory
        self.max_bytes = max_bytes
        self.verify_bytes = verify_bytes
        self.cls, self.pickler_name, self.by_value = _pickler()
        self.pickler_class = _pickler_class(self.cls, ns)
        self.session = None  # the session id written into journal lines (set by the kernel)
        self._reset()

    def _reset(self):
        self.groups = {}  # name -> _Group (one object shared by the group's names)
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
        return journal_line(
            full, execution_count, self.pickler_name, self.session, groups, modules, unsaved, drop, context, ms
        )

    def _pickle(self, values, out):
        """Pickles the dict `values` into `out`: (names referred to, the objects in it whose
        identity matters, by id). Those are kept alive while the group is: a temporary a
        reducer made must not lend its id to a later object, or unrelated names would look
        shared."""
        p = self.pickler_class(out, protocol=5)
        p.by_id = self.by_id
        p.own = values
        p.used = set()
        p.dump(values)
        ids = {}
        memo = getattr(p, "memo", None)
        if memo is not None:
            items = memo.copy().items() if hasattr(memo, "copy") else memo.items()
            for key, entry in items:
                obj = entry[1] if isinstance(entry, tuple) else None
                if obj is not None and obj is not values and _identity_matters(obj):
                    ids[key] = obj
        return p.used, ids

    def _pickle_names(self, names, modules, unsaved, pickled, seg):
        """Pickles each name on its own into `pickled` (name -> (bytes, names used, ids); a
        large array goes straight into the segment `seg`, and its bytes are (offset,
        length) there), or files it under `modules` or `unsaved` (name -> reason)."""
        ns = self.ns
        for n in names:
            v = ns[n]
            t = type(v)
            if t in _SCALARS:
                # Numbers and strings: nothing to share or refer to, nothing that fails.
                data = _dumps({n: v}, 5)
                if len(data) > self.max_bytes:
                    unsaved[n] = _over(len(data), self.max_bytes)
                else:
                    pickled[n] = (data, (), {})
                continue
            if t is types.ModuleType:
                modules[n] = v.__name__
                continue
            why = _why_not(v)
            if (
                why is None
                and not self.by_value
                and isinstance(v, (type, types.FunctionType))
                and getattr(v, "__module__", None) == "__main__"
            ):
                why = "functions and classes defined in the session are saved by value with flowrepl's cloudpickle, which is not loaded here"
            nbytes = getattr(v, "nbytes", None)
            if why is None and isinstance(nbytes, int) and nbytes > self.max_bytes:
                why = _over(nbytes, self.max_bytes)
            if why is not None:
                unsaved[n] = why
                continue
            direct = isinstance(nbytes, int) and nbytes > _WRITE_DIRECT
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
                unsaved[n] = _over(length, self.max_bytes)
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

        for scc in _cycles(list(pickled), edges):
            extra.update(scc)
        more = set()
        for n in extra:
            g = self.groups.get(n)
            if g is not None:
                more.update(g.names)
        return {n for n in extra | more if n in ns and n not in dirty}

    def _unpickler(self, lookup):
        """A function that loads one pickle: the namespace and other names' values (through
        `lookup`) come back as the live objects."""
        ns = self.ns

        class U(pickle.Unpickler):
            def persistent_load(u, pid):
                if pid == ("ns",):
                    return ns
                if pid[0] == _CP_ID:
                    if _cloudpickle is None:
                        raise pickle.UnpicklingError("saved by value with flowrepl's cloudpickle, which is not loaded")
                    return getattr(_cloudpickle, pid[1])
                return lookup(pid[1])

        def load(data):
            if isinstance(data, tuple):
                path, off = data
                with open(path, "rb") as f:
                    f.seek(off)
                    return U(f).load()
            return U(io.BytesIO(data)).load()

        return load

    def checkpoint(self, codes, full, execution_count, context, rebound=None, removed=None):
        """Saves what changed since the last checkpoint (everything when `full` or the first
        time): the names `rebound` (by identity; computed here when None), the names the
        cells' `codes` may have changed, and the groups these share objects with. `removed`:
        the names saved before that are gone. Returns a summary (a dict) for the kernel."""
        t0 = time.perf_counter()
        ns = self.ns
        if self.started and not os.path.isdir(self.dir):
            # The folder was deleted under a running session: nothing saved is on disk.
            self._reset()
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        if self.files is None:
            self.files = _segment_bytes(self.dir)
            self.seq = max((int(f[2:-4]) for f in self.files if f[2:-4].isdigit()), default=0)
        full = full or not self.started
        if full:
            dirty = {n for n in ns if not _dunder(n)}
            drop = []
            self.by_id = {}
        else:
            if rebound is None:
                rebound = [n for n, v in ns.items() if self.saved.get(n, _MISSING) is not v]
                removed = [n for n in self.saved if n not in ns]
            dirty = {
                n for n in rebound if not _dunder(n) and self.unsaved_ids.get(n) != id(ns[n])
            }
            more = touched(ns, codes)
            if more is None:
                dirty = {n for n in ns if not _dunder(n)}
            else:
                dirty |= {n for n in more if not _dunder(n)}
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
            if _identity_matters(v):
                self.by_id.setdefault(id(v), n)
        modules, unsaved, pickled = {}, {}, {}
        seg = _Segment(self)
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
            _replace(os.path.join(self.dir, JOURNAL), text)
            self.lines = 1
        else:
            _append(os.path.join(self.dir, JOURNAL), text)
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
            _collect(self.dir, set(self.segments))
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
                if _identity_matters(ns[n]):
                    self.by_id.setdefault(id(ns[n]), n)
            self._pickle_names(sorted(extra), modules, unsaved, pickled, seg)
        return self._write_groups(pickled, unsaved, seg)

    def _write_groups(self, pickled, unsaved, seg):
        """One group per set of names that share objects or refer to each other in a circle;
        their pickles go into the segment `seg`. Returns the groups written."""
        if not pickled:
            return []
        parent = {n: n for n in pickled}

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        owner = {}
        for n, (_, _, ids) in pickled.items():
            for i in ids:
                o = owner.setdefault(i, n)
                if o != n:
                    parent[find(n)] = find(o)
        for scc in _cycles(list(pickled), lambda n: pickled[n][1] if n in pickled else ()):
            for x in scc[1:]:
                if x in parent and scc[0] in parent:
                    parent[find(x)] = find(scc[0])
        sets = {}
        for n in pickled:
            sets.setdefault(find(n), []).append(n)
        f = seg.file()
        put = []
        for names in sets.values():
            names.sort()
            if len(names) == 1:
                data, used, ids = pickled[names[0]]
                if isinstance(data, tuple):
                    # Written already (a large array).
                    put.append(_Group(names, seg.name, data[0], data[1], set(used) - set(names), ids))
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
                    self._unpickler(self.ns.__getitem__)(data)
                except Exception as e:
                    for x in names:
                        unsaved[x] = f"its saved form does not load back: {type(e).__name__}: {e}"
                    continue
            off = f.tell()
            f.write(data)
            put.append(_Group(names, seg.name, off, len(data), set(used) - set(names), ids))
        return put

    def _unindex(self, name):
        """`name`'s old value is no longer a reference target."""
        old = self.saved.get(name, _MISSING)
        if old is not _MISSING and self.by_id.get(id(old)) == name:
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
        if self.lines >= _MAX_LINES or len(self.files) > _MAX_SEGMENTS or dead > max(live, 1 << 20):
            self._compact(execution_count, context)

    def _compact(self, execution_count, context):
        """Copies the live pickles into one new segment and rewrites the journal as one full
        line; then removes the old segments."""
        self.seq += 1
        seg_name = "s-%06d.bin" % self.seq
        groups = list({id(g): g for g in self.groups.values()}.values())
        files = {}
        try:
            with open(os.path.join(self.dir, seg_name), "wb") as out:
                for g in groups:
                    src = files.get(g.seg)
                    if src is None:
                        src = files[g.seg] = open(os.path.join(self.dir, g.seg), "rb")
                    src.seek(g.off)
                    data = src.read(g.len)
                    off = out.tell()
                    out.write(data)
                    g.seg, g.off = seg_name, off
        finally:
            for src in files.values():
                src.close()
        text = self._line(True, execution_count, groups, self.modules, self.unsaved, [], context)
        _replace(os.path.join(self.dir, JOURNAL), text)
        self.lines = 1
        self.segments = {seg_name: sum(g.len for g in groups)} if groups else {}
        self.files = {seg_name: sum(g.len for g in groups)}
        _collect(self.dir, set(self.segments))

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

    # ---- restoring

    def restore(self, state, segments_dir):
        """Loads a folded checkpoint (`state`, from the Rust reader) into the namespace, which
        the caller emptied. Returns (restored names, {lost name: reason}). When the checkpoint
        is this store's own directory, the store continues from it (the next checkpoint is
        incremental)."""
        ns = self.ns
        restored, lost = [], {}
        if state.get("python") != _python():
            for n in _all_names(state):
                lost[n] = f"saved by Python {state.get('python')}; this is Python {_python()}, which cannot load its pickles"
            return restored, lost
        import importlib

        for n, mod in state["modules"].items():
            try:
                ns[n] = importlib.import_module(mod)
                restored.append(n)
            except BaseException as e:
                lost[n] = f"import {mod} failed: {type(e).__name__}: {e}"
        for n, why in state["unsaved"].items():
            lost[n] = f"not saved: {why}"
        groups = state["groups"]
        where = {}
        for i, g in enumerate(groups):
            for n in g["names"]:
                where[n] = i
        # Groups whose references are restored first (the references form no cycle: mutual
        # ones were saved as one group).
        order, done, visiting = [], set(), set()

        def visit(i):
            if i in done or i in visiting:
                return
            visiting.add(i)
            for r in groups[i]["refs"]:
                j = where.get(r)
                if j is not None:
                    visit(j)
            visiting.discard(i)
            done.add(i)
            order.append(i)

        for i in range(len(groups)):
            visit(i)
        # The pickles, read in file order (one pass over each segment), then loaded in order.
        blobs, unreadable, by_seg = {}, {}, {}
        for i, g in enumerate(groups):
            by_seg.setdefault(g["seg"], []).append(i)
        for seg, idx in by_seg.items():
            idx.sort(key=lambda i: groups[i]["off"])
            path = os.path.join(segments_dir, seg)
            try:
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    for i in idx:
                        off, length = groups[i]["off"], groups[i]["len"]
                        if off + length > size:
                            unreadable[i] = f"{seg} is shorter than the journal says"
                        elif length > _LOAD_FROM_FILE:
                            # Unpickled straight from the file: arrays read into place.
                            blobs[i] = (path, off)
                        else:
                            f.seek(off)
                            blobs[i] = f.read(length)
            except OSError as e:
                for i in idx:
                    unreadable[i] = f"{seg}: {type(e).__name__}: {e}"
        loaded = {}
        ok_groups = []
        load = self._unpickler(lambda name: loaded[name] if name in loaded else ns[name])
        for i in order:
            g = groups[i]
            names = g["names"]
            missing = [r for r in g["refs"] if r not in loaded and r not in ns]
            if missing:
                why = lost.get(missing[0], "it is not in the checkpoint")
                for n in names:
                    lost[n] = f"refers to {missing[0]!r}, which was not restored ({why})"
                continue
            data = blobs.pop(i, None)
            try:
                if data is None:
                    raise EOFError(unreadable.get(i, "unreadable"))
                values = load(data)
            except KeyboardInterrupt:
                raise
            except BaseException as e:
                for n in names:
                    lost[n] = f"its saved form did not load: {type(e).__name__}: {e}"
                continue
            for n in names:
                if n in values:
                    loaded[n] = values[n]
            ok_groups.append(g)
        ns.update(loaded)
        ns["__builtins__"] = builtins
        restored.extend(loaded)
        if os.path.abspath(segments_dir) == os.path.abspath(self.dir):
            self._reset()
            self.started = True
            for g in ok_groups:
                grp = _Group(list(g["names"]), g["seg"], g["off"], g["len"], set(g["refs"]), {})
                for n in grp.names:
                    self.groups[n] = grp
                self.segments[grp.seg] = self.segments.get(grp.seg, 0) + grp.len
            self.modules = {n: m for n, m in state["modules"].items() if n in ns}
            self.unsaved = dict(state["unsaved"])
            self.saved = {n: ns[n] for n in restored if n in ns}
            for n in self.saved:
                if n not in self.modules and _identity_matters(ns[n]):
                    self.by_id.setdefault(id(ns[n]), n)
            self.lines = _MAX_LINES  # the next checkpoint compacts the journal
        return sorted(restored), lost


def _pickler_class(base, ns):
    """`base` (the chosen Pickler) for namespace `ns`: an object that is another name's value
    is saved as a reference to that name, and a session function's globals are the live
    namespace, not a copy of the names it uses. Set `by_id`, `own` (the dict being pickled)
    and `used` (collects the names referred to) on each instance."""

    own = _cloudpickle_ids()

    class P(base):
        def persistent_id(p, obj):
            helper = own.get(id(obj))
            if helper is not None:
                return (_CP_ID, helper)
            name = p.by_id.get(id(obj))
            if name is not None and name not in p.own:
                p.used.add(name)
                return ("n", name)
            if obj is ns:
                return ("ns",)
            refs = getattr(p, "globals_ref", None)
            if refs and obj is refs.get(id(ns), _MISSING):
                return ("ns",)
            return None

        def _dynamic_function_reduce(p, func):
            # cloudpickle only: the function state's globals are left empty.
            r = super()._dynamic_function_reduce(func)
            if func.__globals__ is ns:
                state, slots = r[2]
                slots = dict(slots)
                slots["__globals__"] = {}
                r = r[:2] + ((state, slots),) + r[3:]
            return r

    return P


def _dunder(name):
    return name.startswith("__") and name.endswith("__") and len(name) > 4


def _segment_bytes(directory):
    """Segment file -> size."""
    out = {}
    with os.scandir(directory) as it:
        for e in it:
            if e.name.startswith("s-") and e.name.endswith(".bin"):
                out[e.name] = e.stat().st_size
    return out


def _over(nbytes, limit):
    return f"{nbytes / 1e6:.1f} MB, over the limit of {limit / 1e6:.0f} MB per name (FLOWREPL_SNAPSHOT_MAX_MB)"


def _cycles(starts, edges):
    """The strongly connected components with more than one name among the names reachable
    from `starts` (Tarjan's algorithm, without recursion)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in starts:
        if root in index:
            continue
        work = [(root, iter(edges(root)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges(nxt))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    scc.append(x)
                    if x == node:
                        break
                if len(scc) > 1:
                    found.append(scc)
    return found


class _Segment:
    """The segment file one checkpoint writes, made on first use."""

    def __init__(self, store):
        self.store = store
        self.f = None
        self.name = None

    def file(self):
        if self.f is None:
            self.store.seq += 1
            self.name = "s-%06d.bin" % self.store.seq
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
            _remove(os.path.join(self.store.dir, self.name))


class _Missing:
    pass


_MISSING = _Missing()


def _all_names(state):
    names = list(state["modules"]) + list(state["unsaved"])
    for g in state["groups"]:
        names.extend(g["names"])
    return names


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _collect(directory, keep):
    """Removes segments the journal no longer uses, and temporary files of killed writes."""
    for entry in os.listdir(directory):
        if (entry.startswith("s-") and entry.endswith(".bin") and entry not in keep) or entry.endswith(".tmp"):
            _remove(os.path.join(directory, entry))


def _write_all(fd, data):
    """Writes all of `data` or raises (a short write on a full disk included)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(28, "No space left on device (short write)")
        view = view[n:]


def journal_line(full, execution_count, pickler, session, groups, modules, unsaved, drop, context, ms=None):
    """The one writer of a journal line (read by `task-logger/src/snapshot.rs`, `JournalLine`):
    its JSON text with the newline. `groups` are the pickle groups written (`Group.entry()`);
    `ms` the time it took, when known."""
    line = {
        "v": FORMAT,
        "full": full,
        "execution_count": execution_count,
        "time": _now(),
        "python": _python(),
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


def _append(path, text):
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


def _replace(path, text):
    tmp = path + ".%d.tmp" % os.getpid()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, text.encode())
    except BaseException:
        os.close(fd)
        _remove(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def context():
    """The task's context as JSON text (what `flow.context` holds), or None."""
    try:
        return json.dumps(sys.modules["flowrepl"].flow.context._data)
    except Exception:
        return None


def save_named_json(ns, directory, max_bytes, verify_bytes, execution_count, context, session=None):
    return json.dumps(save_named(ns, directory, max_bytes, verify_bytes, execution_count, context, session))


def save_named(ns, directory, max_bytes, verify_bytes, execution_count, context, session=None):
    """A named checkpoint: everything, into its own directory, replacing what was there only
    once the new one is whole."""
    parent = os.path.dirname(directory)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    tmp = directory + ".%d.tmp" % os.getpid()
    import shutil

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
