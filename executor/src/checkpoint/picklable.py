"""What a checkpoint can save and how a pickle refers to other names: the module
`_flowrepl_checkpoint_picklable` (part of the checkpoint package, see store.py).

Each name is saved on its own, so one object that cannot be pickled costs only its name (and
`why_not` names the reason before pickle's vaguer message). An object that is the value of
another name is saved as a reference to that name ("persistent id"), so `b = a` and a list
holding another name's dict come back shared, and big values are not saved twice. Functions
and classes defined in the session are saved by value with flowrepl's own pinned cloudpickle
(`cloudpickle` below), and restored functions see the live namespace, not a copy of it.
Unit tests: executor/tests/python/test_checkpoint_picklable.py.
"""

import io
import pickle
import types

# Types whose identity never matters: not tracked for sharing, never saved as references.
VALUE_TYPES = frozenset({str, bytes, int, float, complex, bool, type(None), type(Ellipsis), tuple, frozenset, range})
# What pickling cannot carry, named before trying (the error messages of pickle are vaguer).
NOT_SAVEABLE = (
    (types.GeneratorType, "a generator: its running frame cannot be saved"),
    (types.CoroutineType, "a coroutine: its running frame cannot be saved"),
    (types.AsyncGeneratorType, "an async generator: its running frame cannot be saved"),
    (types.FrameType, "a frame"),
    (types.TracebackType, "a traceback"),
    (io.IOBase, "an open file or stream: its OS handle cannot be saved"),
)
# Names a cell can use to change any variable without naming it: such a cell marks them all.
WHOLE_NAMESPACE = frozenset({"globals", "exec", "eval", "vars", "__import__", "setattr"})
# Values with nothing to share or refer to: pickled on the fast path.
SCALARS = frozenset({int, float, str, bytes, bool, type(None), complex})

# flowrepl's own cloudpickle (a pinned copy, compiled from the source embedded in the
# binary): set by the Rust side when it loads this package. It is in no `sys.modules` and on
# no `sys.path`, so a cell cannot import it and what can be restored does not depend on what
# the user installed. Its own helpers (the reconstructors a pickle names) are saved as
# persistent ids, never by a module name that would have to be importable at load time.
cloudpickle = None
CP_ID = "cp"


class _Missing:
    pass


# A value no name holds (`dict.get`'s default where None is a value).
MISSING = _Missing()


def pickler():
    """(Pickler class, description, by value): flowrepl's cloudpickle, else plain pickle
    (which saves session functions and classes only by name)."""
    if cloudpickle is not None:
        version = getattr(cloudpickle, "__version__", "?")
        return cloudpickle.Pickler, f"cloudpickle {version} (flowrepl)", True
    return pickle.Pickler, "pickle", False


def _cloudpickle_ids():
    """id -> name of the private cloudpickle's own functions and classes."""
    if cloudpickle is None:
        return {}
    return {
        id(v): k
        for k, v in vars(cloudpickle).items()
        if isinstance(v, (type, types.FunctionType)) and getattr(v, "__module__", None) == cloudpickle.__name__
    }


def identity_matters(obj):
    """False for values whose identity no code can rely on (numbers, strings, tuples), and
    for modules, classes and functions that pickle by name (defined outside the session)."""
    t = type(obj)
    if t in VALUE_TYPES or t is types.ModuleType:
        return False
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        return getattr(obj, "__module__", None) == "__main__"
    return True


def why_not(value):
    """Why `value` cannot be saved, known without pickling it; None when it may be."""
    for kind, why in NOT_SAVEABLE:
        if isinstance(value, kind):
            return why
    name = type(value).__name__
    if name in ("lock", "RLock", "_RLock", "Condition", "Semaphore", "Event"):
        return f"a thread synchronisation object ({name}): its state belongs to this process"
    if name in ("socket", "SSLSocket"):
        return "a socket: its OS handle cannot be saved"
    return None


def over(nbytes, limit):
    """The reason for a value over the per-name limit."""
    return f"{nbytes / 1e6:.1f} MB, over the limit of {limit / 1e6:.0f} MB per name (FLOWREPL_CHECKPOINT_MAX_MB)"


def dunder(name):
    """`__name__`-style names, never saved."""
    return name.startswith("__") and name.endswith("__") and len(name) > 4


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
    if seen & WHOLE_NAMESPACE:
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
        if more & WHOLE_NAMESPACE:
            return None
        for n in more:
            if n in ns and n not in names:
                names.add(n)
                todo.append(n)
    return names


def pickler_class(base, ns):
    """`base` (the chosen Pickler) for namespace `ns`: an object that is another name's value
    is saved as a reference to that name, and a session function's globals are the live
    namespace, not a copy of the names it uses. Set `by_id`, `own` (the dict being pickled)
    and `used` (collects the names referred to) on each instance."""

    own = _cloudpickle_ids()

    class P(base):
        def persistent_id(p, obj):
            helper = own.get(id(obj))
            if helper is not None:
                return (CP_ID, helper)
            name = p.by_id.get(id(obj))
            if name is not None and name not in p.own:
                p.used.add(name)
                return ("n", name)
            if obj is ns:
                return ("ns",)
            refs = getattr(p, "globals_ref", None)
            if refs and obj is refs.get(id(ns), MISSING):
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


def dump(pickler_cls, values, by_id, out):
    """Pickles the dict `values` into `out` with `pickler_cls` (from `pickler_class`): (names
    referred to, the objects in it whose identity matters, by id). Those are kept alive while
    the group is: a temporary a reducer made must not lend its id to a later object, or
    unrelated names would look shared."""
    p = pickler_cls(out, protocol=5)
    p.by_id = by_id
    p.own = values
    p.used = set()
    p.dump(values)
    ids = {}
    memo = getattr(p, "memo", None)
    if memo is not None:
        items = memo.copy().items() if hasattr(memo, "copy") else memo.items()
        for key, entry in items:
            obj = entry[1] if isinstance(entry, tuple) else None
            if obj is not None and obj is not values and identity_matters(obj):
                ids[key] = obj
    return p.used, ids


def unpickler(ns, lookup):
    """A function that loads one pickle (bytes, or (path, offset) to read it from a file):
    the namespace `ns` and other names' values (through `lookup`) come back as the live
    objects."""

    class U(pickle.Unpickler):
        def persistent_load(u, pid):
            if pid == ("ns",):
                return ns
            if pid[0] == CP_ID:
                if cloudpickle is None:
                    raise pickle.UnpicklingError("saved by value with flowrepl's cloudpickle, which is not loaded")
                return getattr(cloudpickle, pid[1])
            return lookup(pid[1])

    def load(data):
        if isinstance(data, tuple):
            path, off = data
            with open(path, "rb") as f:
                f.seek(off)
                return U(f).load()
        return U(io.BytesIO(data)).load()

    return load
