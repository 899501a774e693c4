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
    if not sys.flags.safe_path and (not sys.path or sys.path[0] != ""):
        sys.path.insert(0, "")
    import __main__
    return __main__.__dict__


def reset_namespace(ns):
    """`restart` in-process: empty __main__ as a fresh interpreter has it (modules stay loaded)."""
    keep = {k: ns[k] for k in ("__name__", "__doc__", "__package__", "__loader__", "__spec__",
                               "__builtins__") if k in ns}
    ns.clear()
    ns.update(keep)
    ns["__annotations__"] = {}


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
