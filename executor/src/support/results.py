"""What a cell's result shows: the module `_flowrepl_results` (part of the support package,
loaded when the executor starts; see executor/src/support.rs, `SUPPORT`). An exception as its
type, message and traceback; figures as PNG images; the namespace's variables. Unit tests:
executor/tests/python/test_support_results.py.
"""
import sys


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


# Figures rendered past the per-cell limit: the MCP front keeps them and answers with a link
# to each (a resource the client reads when it wants it).
LINKED_IMAGES = 32


def collect_images(value, max_images, max_pixels):
    """MCP mode, after a cell: ([(source, base64 png, width, height, bytes)], [notes]).

    Up to max_images are returned in the result, and up to LINKED_IMAGES more as links.

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
            if len(images) >= max_images + LINKED_IMAGES:
                skipped += 1
                continue
            try:
                add(f"figure {num}", _render_figure(fig, max_pixels))
            except Exception as e:
                notes.append(f"figure {num}: rendering raised {type(e).__name__}: {e}")
        if skipped:
            notes.append(f"{skipped} more open figure(s) were closed without being returned "
                         f"(limit: {max_images} images per cell, and {LINKED_IMAGES} more as links)")
        if managers:
            try:
                pyplot.close("all")
            except Exception as e:
                notes.append(f"closing figures raised {type(e).__name__}: {e}")
    return images, notes


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
