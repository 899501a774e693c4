"""The session's interpreter state: the module `_flowrepl_session` (part of the support
package, loaded when the executor starts; see executor/src/support.rs, `SUPPORT`). Stdio that
a cell cannot break, `sys.path` and `sys.argv` as the interactive interpreter has them,
startup files, and the namespace's reset and end. Unit tests:
executor/tests/python/test_support_session.py.
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


def apply_setup(argv, path0, layer):
    """Drop-in mode: `sys.argv` as the REPL script would see it, its folder first on sys.path.
    The task's package layer (`layer`): on sys.path before the interpreter's site-packages."""
    if argv is not None:
        sys.argv = list(argv)
    if path0 is not None and (not sys.path or sys.path[0] != path0):
        sys.path.insert(0, path0)
    if layer is not None:
        global _LAYER
        _LAYER = layer
        if layer not in sys.path:
            at = next(
                (i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))),
                len(sys.path),
            )
            sys.path.insert(at, layer)
        layer_changed([])


_LAYER = None
_LAYER_PTH = set()


def layer_changed(modules):
    """The package layer changed: its new `.pth` files run (as `site` runs them at start, once
    each), the import caches are dropped, and the names of `modules` already imported are
    returned (they stay as imported until a restart)."""
    import importlib
    import site

    if _LAYER is not None:
        try:
            names = sorted(os.listdir(_LAYER))
        except OSError:
            names = []
        for name in names:
            if name.endswith(".pth") and name not in _LAYER_PTH:
                _LAYER_PTH.add(name)
                site.addpackage(_LAYER, name, None)
    importlib.invalidate_caches()
    return [m for m in modules if m in sys.modules]


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
