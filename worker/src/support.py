"""Python side of the flowrepl executor: only what is simpler in Python and off the hot path.

Loaded once as the module ``_flowrepl`` when the executor starts.
"""
import io
import os
import sys


class NoStdin(io.TextIOBase):
    """sys.stdin of a flowrepl session: always at EOF, and says why on stderr."""

    def _eof(self, what):
        try:
            sys.stderr.write(
                f"flowrepl: {what} reached EOF: the kernel has no interactive stdin "
                "(its stdin carries the protocol). Pass data in the code instead.\n"
            )
        except Exception:
            pass
        return ""

    def readable(self):
        return True

    def read(self, size=-1):
        return self._eof("sys.stdin.read()")

    def readline(self, size=-1):
        return self._eof("input()/sys.stdin.readline()")

    def readlines(self, hint=-1):
        self._eof("sys.stdin.readlines()")
        return []

    def fileno(self):
        return 0  # /dev/null: os.read(0, n) returns b"" at once

    def isatty(self):
        return False

    def close(self):
        pass  # exit()/quit() close sys.stdin; keep answering EOF instead of ValueError

    @property
    def encoding(self):
        return "utf-8"

    @property
    def name(self):
        return "<stdin>"


def _open_std(fd):
    return io.TextIOWrapper(
        io.FileIO(fd, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        write_through=bool(os.environ.get("PYTHONUNBUFFERED")),
    )


def setup():
    sys.stdin = sys.__stdin__ = NoStdin()
    # Like the interactive interpreter: modules in the working directory import.
    if not getattr(sys.flags, "safe_path", False) and (not sys.path or sys.path[0] != ""):
        sys.path.insert(0, "")
    import __main__
    return __main__.__dict__


class ApprovalCancelled(Exception):
    """A request for approval was dismissed, timed out, or its channel failed."""


class _Step:
    """`with flow.step(name, **data) as s:`: step_start and step_end events around the block
    (step_end says how long it took and whether it raised; the exception goes on)."""

    def __init__(self, flow, name, data):
        self._flow, self.name, self._data = flow, name, data

    def __enter__(self):
        self._flow._report("step_start", {"name": self.name, **self._data})
        self._flow._steps.append(self.name)
        self._t0 = self._flow._clock()
        return self

    def log(self, message):
        """A step_log event inside this step."""
        self._flow._report("step_log", {"name": self.name, "message": str(message)})

    def __exit__(self, kind, exc, tb):
        ms = round((self._flow._clock() - self._t0) * 1000.0, 3)
        steps = self._flow._steps
        if steps and steps[-1] == self.name:
            steps.pop()
        self._flow._report(
            "step_end",
            {
                "name": self.name,
                "duration_ms": ms,
                "success": kind is None,
                "error": None if kind is None else kind.__name__,
            },
        )
        return False


class Context:
    """The task's context: a JSON object that outlives the kernel (every kernel started
    later for the same plan and task starts from it). Read it like a mapping; change it only
    with `update`, which saves the whole new context to the task log."""

    def __init__(self, data, save):
        self._data = data
        self._save = save

    def __getitem__(self, key):
        return self._data[key]

    def get(self, key, default=None):
        return self._data.get(key, default)

    def __contains__(self, key):
        return key in self._data

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)

    def keys(self):
        return self._data.keys()

    def values(self):
        return self._data.values()

    def items(self):
        return self._data.items()

    def __eq__(self, other):
        return dict(self._data) == (dict(other) if isinstance(other, Context) else other)

    def __repr__(self):
        return f"flow.context({self._data!r})"

    def update(self, data, merge=True):
        """Merges `data` (a dict of JSON values) into the context, or with `merge=False`
        replaces it; returns the new context as a dict. Anything not JSON raises TypeError
        naming the key, and nothing is saved."""
        if not isinstance(data, dict):
            if isinstance(data, Context):
                data = dict(data._data)
            else:
                raise TypeError("flow.context.update takes a dict")
        new = {**self._data, **data} if merge else dict(data)
        self._data = self._save(new)
        return dict(self._data)


class Flow:
    """The task this session belongs to, and a way to report what the cell is doing.
    Available in every cell as `flow` (also `flowrepl.flow`); not a session variable."""

    ApprovalCancelled = ApprovalCancelled

    def __init__(self, emit, clock, count, save_context, approve, context, identity):
        self._emit = emit
        self._approve = approve
        self.last_approval = None
        self._clock = clock
        self._count = count
        self.context = Context(context, save_context)
        self._steps = []
        self.plan_id = identity.get("plan_id")
        self.task_id = identity.get("task_id")
        self.task_name = identity.get("task_name")
        self.session_id = identity.get("session_id")

    @property
    def execution_count(self):
        """The running cell's `execution_count`."""
        return self._count()

    def __repr__(self):
        return f"<flow plan={self.plan_id!r} task={self.task_id!r} cell={self.execution_count}>"

    def event(self, name, /, **data):
        """Reports a structured event: a name and JSON-serialisable keyword data
        (anything else raises TypeError naming the key)."""
        if not isinstance(name, str) or not name:
            raise TypeError("flow.event: the name must be a non-empty string")
        self._report(name, data)

    def step(self, name, /, **data):
        """A context manager: step_start and step_end events around the block; `s.log(msg)`
        inside it adds a step_log event. Steps nest: each event names its innermost step."""
        if not isinstance(name, str) or not name:
            raise TypeError("flow.step: the name must be a non-empty string")
        return _Step(self, name, data)

    def request_approval(self, message, /, timeout_s=None, **data):
        """Asks a person and waits for the answer: True (approved), False (declined), None
        (nobody can be asked: no channel), or raises flow.ApprovalCancelled (dismissed, or
        no answer within `timeout_s` seconds). The wait does not count against the cell's
        timeout; interrupting the cell ends it with KeyboardInterrupt. `flow.last_approval`
        then holds the outcome and the person's comment."""
        if not isinstance(message, str) or not message:
            raise TypeError("flow.request_approval: the message must be a non-empty string")
        if timeout_s is not None:
            if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                    or not timeout_s > 0 or timeout_s != timeout_s:
                raise ValueError("flow.request_approval: timeout_s must be a positive number of seconds or None")
            timeout_s = float(timeout_s)
        self._flush()
        outcome, text = self._approve(message, data, timeout_s, self._steps[-1] if self._steps else None)
        self.last_approval = {"outcome": outcome, "comment": text if outcome in ("approved", "declined") else None,
                              "reason": None if outcome in ("approved", "declined") else text}
        if outcome == "approved":
            return True
        if outcome == "declined":
            return False
        if outcome == "unavailable":
            return None
        raise ApprovalCancelled(text or "the request for approval was cancelled")

    def _flush(self):
        out = sys.stdout
        if out is not None:
            try:
                out.flush()  # so that the event is placed after what was printed before it
            except Exception:
                pass

    def _report(self, name, data):
        self._flush()
        self._emit(name, data, self._steps[-1] if self._steps else None)


def install_flow(emit, clock, count, save_context, approve, context, identity):
    """`flow` for every cell: a builtin (so not a session variable, and a cell that rebinds
    the name only shadows it) and `flowrepl.flow`."""
    import builtins
    import types

    flow = Flow(emit, clock, count, save_context, approve, context, identity)
    builtins.flow = flow
    module = types.ModuleType("flowrepl", "flowrepl's own objects for cells: flowrepl.flow")
    module.flow = flow
    module.ApprovalCancelled = ApprovalCancelled
    sys.modules["flowrepl"] = module
    return flow


def apply_setup(argv, path0):
    """Drop-in mode: `sys.argv` as the REPL script would see it, its folder first on sys.path."""
    if argv is not None:
        sys.argv = list(argv)
    if path0 is not None and (not sys.path or sys.path[0] != path0):
        sys.path.insert(0, path0)


def run_startup(ns, files):
    """Runs startup files in the session, as the interactive interpreter runs PYTHONSTARTUP.
    An error in one is reported and the others still run. Returns the error texts."""
    errors = []
    for path in files:
        try:
            with open(path, "rb") as f:
                source = f.read()
            exec(compile(source, path, "exec"), ns)
        except BaseException:
            import traceback

            errors.append(f"startup file {path} failed:\n{traceback.format_exc()}")
    return errors


def reset_namespace(ns):
    """`restart` in-process: empty __main__ as a fresh interpreter has it (modules stay loaded)."""
    keep = {k: ns[k] for k in ("__name__", "__doc__", "__package__", "__loader__", "__spec__",
                               "__builtins__") if k in ns}
    ns.clear()
    ns.update(keep)
    ns["__annotations__"] = {}


def finish(ns):
    """Kernel exit: what a Python process does on its way out. Runs the atexit handlers (in
    their usual order), then drops the session's objects so that files left open are flushed
    and closed by their finalizers, then flushes stdio. Errors are reported on stderr, as
    Python does, and never stop the rest."""
    import atexit
    import gc

    try:
        atexit._run_exitfuncs()
    except BaseException:
        pass
    try:
        reset_namespace(ns)
        gc.collect()
    except BaseException:
        pass
    flush_std()


def flush_std():
    """Flush sys.stdout/sys.stderr after a cell; replace them if the cell closed or broke them."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name, None)
        try:
            stream.flush()
        except Exception:
            setattr(sys, name, _open_std(fd))


def register_sources(cells):
    """Make cell sources visible to tracebacks, inspect and warnings via linecache."""
    import linecache

    for name, source in cells:
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)


def _text(obj):
    try:
        return str(obj)
    except BaseException:
        try:
            return repr(obj)
        except BaseException:
            return f"<unprintable {type(obj).__name__}>"


def format_exception(exc):
    """(type name, message, traceback text) of an exception raised by a cell."""
    import traceback

    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:
        text = f"{type(exc).__name__}: {_text(exc)}\n"
    return type(exc).__name__, _text(exc), text


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_size(data):
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _render_figure(fig, max_pixels):
    """PNG bytes of a matplotlib figure, at a dpi lowered to fit max_pixels if needed."""
    import io

    w_in, h_in = fig.get_size_inches()
    dpi = fig.dpi
    if w_in * h_in * dpi * dpi > max_pixels:
        dpi = (max_pixels / (w_in * h_in)) ** 0.5
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def collect_images(value, max_images, max_pixels):
    """MCP mode, after a cell: ([(source, base64 png, width, height, bytes)], [notes]).

    The final value's _repr_png_() (or a matplotlib Figure value) comes first, then every
    figure pyplot still has open, which are closed: a figure is returned once.
    """
    import base64

    images, notes = [], []

    def add(source, data):
        if not isinstance(data, (bytes, bytearray)) or not bytes(data[:8]) == _PNG_SIGNATURE:
            notes.append(f"{source}: not a PNG image; left out")
            return
        w, h = _png_size(data)
        if w * h > max_pixels:
            notes.append(f"{source}: {w}x{h} pixels is over the limit of {max_pixels}; left out")
            return
        images.append((source, base64.b64encode(data).decode("ascii"), w, h, len(data)))

    pyplot = sys.modules.get("matplotlib.pyplot")
    shown = set()
    if value is not None:
        try:
            if hasattr(type(value), "_repr_png_"):
                data = value._repr_png_()
                if isinstance(data, tuple):  # IPython allows (data, metadata)
                    data = data[0]
                if isinstance(data, str):
                    data = base64.b64decode(data)
                if data is not None:
                    add("result", data)
            elif hasattr(type(value), "savefig") and type(value).__module__.startswith("matplotlib"):
                add("result", _render_figure(value, max_pixels))
                shown.add(id(value))
        except Exception as e:
            notes.append(f"result: rendering it as PNG raised {type(e).__name__}: {e}")
    if pyplot is not None:
        try:
            from matplotlib._pylab_helpers import Gcf

            managers = sorted(Gcf.figs.items())
        except Exception:
            managers = []
        skipped = 0
        for num, manager in managers:
            fig = manager.canvas.figure
            if id(fig) in shown:
                continue
            if len(images) >= max_images:
                skipped += 1
                continue
            try:
                add(f"figure {num}", _render_figure(fig, max_pixels))
            except Exception as e:
                notes.append(f"figure {num}: rendering raised {type(e).__name__}: {e}")
        if skipped:
            notes.append(f"{skipped} more open figure(s) were closed without being returned "
                         f"(limit: {max_images} images per cell)")
        if managers:
            try:
                pyplot.close("all")
            except Exception as e:
                notes.append(f"closing figures raised {type(e).__name__}: {e}")
    return images[:max_images], notes


def list_variables(ns, max_repr=120):
    """The namespace as a JSON list for list_variables: name, type, module, short repr, size."""
    import json
    import reprlib

    short = reprlib.Repr()
    short.maxstring = short.maxother = max_repr
    out = []
    for name in sorted(ns):
        if name.startswith("__") and name.endswith("__"):
            continue
        value = ns[name]
        t = type(value)
        item = {"name": name, "type": t.__name__}
        module = getattr(t, "__module__", None)
        if isinstance(module, str) and module != "builtins":
            item["module"] = module
        try:
            text = " ".join(short.repr(value).split())
        except BaseException as e:
            text = f"<repr failed: {type(e).__name__}>"
        if len(text) > max_repr:
            text = text[: max_repr - 1] + "…"
        item["repr"] = text
        if not isinstance(value, type) and t.__name__ != "module":
            try:
                shape = getattr(value, "shape", None)
                if isinstance(shape, tuple) and all(isinstance(d, int) for d in shape):
                    item["shape"] = list(shape)
            except BaseException:
                pass
            if hasattr(t, "__len__"):
                try:
                    item["len"] = len(value)
                except BaseException:
                    pass
        out.append(item)
    return json.dumps(out)
