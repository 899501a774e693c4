"""Loading a checkpoint into a namespace: the module `_flowrepl_checkpoint_restore` (part of
the checkpoint package, see store.py). Every name that cannot come back is named with the
reason; the rest come back, shared as they were. Unit tests:
executor/tests/python/test_checkpoint_restore.py.
"""

import builtins
import importlib
import os

# Set by the loader once this module has run (executor/src/support.rs, `CHECKPOINT`); used only
# inside functions.
files = graph = picklable = None

# Pickles larger than this are unpickled from the segment file, not read into memory first.
LOAD_FROM_FILE = 1 << 20


def all_names(state):
    """Every name a folded checkpoint mentions."""
    names = list(state["modules"]) + list(state["unsaved"])
    for g in state["groups"]:
        names.extend(g["names"])
    return names


def _read(groups, segments_dir):
    """The groups' pickles, read in file order (one pass over each segment): ({group index:
    bytes, or (path, offset) for one to unpickle from the file}, {group index: why it cannot
    be read})."""
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
                    elif length > LOAD_FROM_FILE:
                        # Unpickled straight from the file: arrays read into place.
                        blobs[i] = (path, off)
                    else:
                        f.seek(off)
                        blobs[i] = f.read(length)
        except OSError as e:
            for i in idx:
                unreadable[i] = f"{seg}: {type(e).__name__}: {e}"
    return blobs, unreadable


def load(ns, state, segments_dir):
    """Loads a folded checkpoint (`state`, from the Rust reader) into the namespace `ns`,
    which the caller emptied. Returns (restored names, {lost name: reason}, the groups that
    loaded; None when nothing could be, as the checkpoint is another Python version's)."""
    restored, lost = [], {}
    if state.get("python") != files.python():
        for n in all_names(state):
            lost[n] = (
                f"saved by Python {state.get('python')}; this is Python {files.python()}, which cannot load its pickles"
            )
        return restored, lost, None
    for n, mod in state["modules"].items():
        try:
            ns[n] = importlib.import_module(mod)
            restored.append(n)
        except BaseException as e:
            lost[n] = f"import {mod} failed: {type(e).__name__}: {e}"
    for n, why in state["unsaved"].items():
        lost[n] = f"not saved: {why}"
    groups = state["groups"]
    where = {n: i for i, g in enumerate(groups) for n in g["names"]}
    blobs, unreadable = _read(groups, segments_dir)
    loaded = {}
    ok_groups = []
    unpickle = picklable.unpickler(ns, lambda name: loaded[name] if name in loaded else ns[name])
    for i in graph.load_order(groups, where):
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
            values = unpickle(data)
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
    return restored, lost, ok_groups
