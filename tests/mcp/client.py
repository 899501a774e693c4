"""MCP checks of `flowrepl mcp`, driven by the official Python SDK (`mcp`).

Size: one file of scenarios, one function each, so that the Rust tests name them.

Usage: client.py SCENARIO --flowrepl BIN --log-dir DIR [--worker] [--python VENV] [--env K=V ...]

Each scenario starts `flowrepl mcp` over stdio, talks to it as an MCP client would, and
raises AssertionError with the evidence when something is off. On success it prints one JSON
line (facts for the Rust test to check further, e.g. against the task log) and exits 0.
"""
import argparse
import base64
import json
import os
import tempfile
import time

import anyio
import mcp.types as types
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client import Client
from mcp.shared.exceptions import MCPError
from tasks_ext import TASKS, TaskEnded, Tasks
from tasks_ext import cancel as cancel_task

SCENARIOS = {}
# Scenarios run with the SDK's 2026-07-28 Client (and the tasks extension), not ClientSession.
MODERN = {"tasks"}
# Scenarios that write files into their kernel's working directory.
IN_WORKDIR = {"files"}
# Scenarios whose client answers elicitation requests, and what it was asked.
ELICITING = set()
ASKED = []


def scenario(f):
    SCENARIOS[f.__name__] = f
    return f


def text_of(res):
    return "".join(c.text for c in res.content if c.type == "text")


async def run_cell(s, code, **kw):
    return await s.call_tool("execute_code", {"code": code, **kw})


@scenario
async def tools(s, opts):
    init = opts.init
    assert init.server_info.name == "flowrepl", init.server_info
    assert "read_output" in (init.instructions or ""), init.instructions
    listed = {t.name: t for t in (await s.list_tools()).tools}
    assert set(listed) == {"execute_code", "read_output", "interrupt", "restart_session",
                           "list_variables", "checkpoint", "restore_checkpoint",
                           "list_checkpoints", "wait_cell", "upload_file", "download_file",
                           "list_files", "delete_file", "install_packages"}, sorted(listed)
    assert listed["install_packages"].input_schema["required"] == ["packages"]
    assert listed["restart_session"].input_schema["properties"]["restore"]["type"] == "boolean"
    assert "name" in listed["checkpoint"].input_schema["properties"]
    ex = listed["execute_code"]
    assert ex.input_schema["required"] == ["code"], ex.input_schema
    assert ex.input_schema["properties"]["timeout_ms"]["minimum"] == 1, ex.input_schema
    assert ex.input_schema.get("additionalProperties") is False, ex.input_schema
    out = ex.output_schema
    for field in ("success", "stdout", "stderr", "result", "error", "execution_count",
                  "added_vars", "output_cut", "usage"):
        assert field in out["properties"], (field, sorted(out["properties"]))
    assert "persist" in ex.description and "read_output" in ex.description
    ro = listed["read_output"]
    assert set(ro.input_schema["required"]) == {"execution_count", "stream"}, ro.input_schema
    for name, t in listed.items():
        assert t.output_schema is not None, name
        assert len(t.description) > 60, name
    assert listed["list_variables"].annotations.read_only_hint is True
    return {"tools": sorted(listed), "execute_code": ex.description}


@scenario
async def persistence(s, opts):
    r = await run_cell(s, "x = 41\ndef f(v):\n    return v * 2\nprint('hello')")
    assert not r.is_error, text_of(r)
    assert text_of(r) == "hello\n", repr(text_of(r))
    sc = r.structured_content
    assert sc["added_vars"] == ["f", "x"] and sc["stdout"] == "hello\n", sc
    assert sc["output_cut"] == [] and sc["execution_count"] == 1, sc
    r = await run_cell(s, "f(x + 1)")
    assert text_of(r) == "Out[2]: 84", repr(text_of(r))
    assert r.structured_content["result"] == "84"
    r = await run_cell(s, "import json\ny = json.dumps({'a': x})")
    assert "json" in r.structured_content["added_imports"], r.structured_content
    r = await run_cell(s, "y")
    assert text_of(r) == """Out[4]: '{"a": 41}'""", text_of(r)
    r = await run_cell(s, "pass")
    assert text_of(r) == "[cell 5 ran: no output]", text_of(r)
    return {"mode": r.structured_content["mode"], "pid": r.structured_content["usage"]["pid"]}


@scenario
async def errors(s, opts):
    r = await run_cell(s, "a = 1\n1/0")
    assert r.is_error is True, r
    t = text_of(r)
    assert t.startswith("[stderr]\nTraceback") and "ZeroDivisionError: division by zero" in t, t
    sc = r.structured_content
    assert sc["success"] is False and sc["error"]["type"] == "ZeroDivisionError", sc
    r = await run_cell(s, "def broken(:")
    assert r.is_error and r.structured_content["error"]["type"] == "SyntaxError"
    r = await run_cell(s, "import sys; print('to stderr', file=sys.stderr); a + 1")
    assert not r.is_error and text_of(r) == "[stderr]\nto stderr\nOut[3]: 2", repr(text_of(r))
    codes = []
    for bad in ({"code": 5}, {"code": "1", "timeout_ms": 0}, {"code": "1", "extra": True}, {}):
        try:
            await s.call_tool("execute_code", bad)
        except MCPError as e:
            codes.append(e.error.code)
        else:
            raise AssertionError(f"{bad} was accepted")
    assert codes == [-32602] * 4, codes
    try:
        await s.call_tool("read_output", {"execution_count": 1, "stream": "nope"})
        raise AssertionError("a bad stream was accepted")
    except MCPError as e:
        assert e.error.code == -32602, e
    r = await run_cell(s, "a")
    assert text_of(r) == "Out[4]: 1", text_of(r)
    r = await s.call_tool("read_output", {"execution_count": 4, "stream": "stdout"})
    assert r.is_error and "not held" in text_of(r), text_of(r)
    r = await s.call_tool("read_output", {"execution_count": 99, "stream": "stdout"})
    assert r.is_error and "no cell 99" in text_of(r), text_of(r)
    return {}


@scenario
async def events(s, opts):
    """flow events and MCP:: lines: one line each in the text, all of them structured."""
    code = (
        "flow.event('loaded', rows=3)\n"
        "with flow.step('train') as st:\n"
        "    st.log('epoch 1')\n"
        """print('MCP::metric {"loss": 0.5}')"""
    )
    r = await run_cell(s, code)
    t = text_of(r)
    assert '[event 1] loaded {"rows":3}' in t, t
    assert '[event 3 in train] step_log {"name":"train","message":"epoch 1"}' in t, t
    assert '[event 5] metric {"loss":0.5}' in t, t
    ev = r.structured_content["events"]
    assert [e["name"] for e in ev] == ["loaded", "step_start", "step_log", "step_end", "metric"], ev
    return {"events": len(ev)}


async def elicit(ctx, params):
    """A person who answers by the first word of the message: accept, decline, cancel, slow
    (accepts after 1.2 s), or never (waits until the request is cancelled)."""
    entry = {"message": params.message, "schema": params.requested_schema, "cancelled": False}
    ASKED.append(entry)
    word = params.message.split()[0]
    try:
        if word == "accept":
            return types.ElicitResult(action="accept", content={"comment": "fine by me"})
        if word == "decline":
            return types.ElicitResult(action="decline")
        if word == "cancel":
            return types.ElicitResult(action="cancel")
        if word == "slow":
            await anyio.sleep(1.2)
            return types.ElicitResult(action="accept", content={})
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        entry["cancelled"] = True
        raise


def approval_statuses(r):
    return [e["data"]["status"] for e in r.structured_content["events"] if e["name"] == "approval"]


@scenario
async def approvals(s, opts):
    """flow.request_approval as elicitation/create: accept, decline, cancel, timeout_s, a slow
    answer past the cell's timeout, and an interrupt while waiting."""
    code = (
        "a = flow.request_approval('accept the deploy?', env='prod')\n"
        "comment = flow.last_approval['comment']\n"
        "b = flow.request_approval('decline this?')\n"
        "try:\n    flow.request_approval('cancel this?')\nexcept flow.ApprovalCancelled as e:\n    c = str(e)\n"
        "try:\n    flow.request_approval('never answered', timeout_s=0.5)\n"
        "except flow.ApprovalCancelled as e:\n    d = str(e)\n"
        "(a, comment, b, c, d)"
    )
    r = await run_cell(s, code)
    assert not r.is_error, text_of(r)
    assert r.structured_content["result"] == (
        "(True, 'fine by me', False, 'the person dismissed the request', 'no answer within 0.5 s')"
    ), r.structured_content["result"]
    assert approval_statuses(r) == ["requested", "approved", "requested", "declined",
                                    "requested", "cancelled", "requested", "timed_out"], r.structured_content
    assert ASKED[0]["message"] == 'accept the deploy?\n\n{"env":"prod"}', ASKED[0]
    assert "comment" in ASKED[0]["schema"]["properties"], ASKED[0]["schema"]
    assert "[event 2] approval" in text_of(r), text_of(r)
    # The request the cell gave up on was cancelled on the client too.
    for _ in range(50):
        if ASKED[3]["cancelled"]:
            break
        await anyio.sleep(0.02)
    assert ASKED[3]["cancelled"], ASKED[3]
    # An answer after the cell's own timeout: the wait does not count; progress says why
    # the cell is waiting.
    heard = []

    async def on_progress(progress, total, message):
        heard.append(message or "")

    r = await s.call_tool("execute_code", {"code": "flow.request_approval('slow answer')", "timeout_ms": 600},
                          progress_callback=on_progress)
    assert not r.is_error and text_of(r).endswith("Out[2]: True"), text_of(r)
    assert any("waiting for approval: slow answer" in m for m in heard), heard
    # Interrupted while waiting.
    results = {}

    async def waiting():
        results["cell"] = await run_cell(s, "kept = 1\nflow.request_approval('never mind')")

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiting)
        while len(ASKED) < 6:
            await anyio.sleep(0.02)
        results["interrupt"] = await s.call_tool("interrupt", {})
    cell = results["cell"]
    assert results["interrupt"].structured_content["interrupted"] is True
    assert cell.is_error and cell.structured_content["error"]["type"] == "KeyboardInterrupt", text_of(cell)
    assert approval_statuses(cell) == ["requested", "interrupted"], cell.structured_content
    r = await run_cell(s, "kept")
    assert text_of(r).endswith("Out[4]: 1"), text_of(r)
    return {"asked": len(ASKED)}


@scenario
async def approvals_without_elicitation(s, opts):
    """A client without the elicitation capability: None at once, and the request recorded."""
    t0 = time.monotonic()
    r = await run_cell(s, "flow.request_approval('anyone?') is None")
    assert time.monotonic() - t0 < 5
    assert "Out[1]: True" in text_of(r), text_of(r)
    assert approval_statuses(r) == ["requested", "unavailable"], r.structured_content
    reason = r.structured_content["events"][1]["data"]["reason"]
    assert "elicitation capability" in reason, reason
    return {}


ELICITING.add("approvals")


@scenario
async def interpreter(s, opts):
    """Which Python the server runs cells in (for the pip-install check)."""
    r = await run_cell(s, "import sys; print(list(sys.version_info[:2]), sys.prefix, sys.executable)")
    assert not r.is_error, text_of(r)
    version, prefix, executable = r.structured_content["stdout"].strip().rsplit(" ", 2)
    return {"version": json.loads(version.replace(" ", "")), "prefix": prefix, "executable": executable}


@scenario
async def large_requests(s, opts):
    """A cell of 50 MB runs under the default limit; a call over FLOWREPL_MAX_REQUEST_BYTES
    (when set) is a -32001 error and the session goes on."""
    limit = int(opts.env_map.get("FLOWREPL_MAX_REQUEST_BYTES", str(256 << 20)))
    size = 50 << 20 if limit > (60 << 20) else 2 * limit
    code = "big = '" + "x" * size + "'\nlen(big)"
    if size < limit:
        r = await run_cell(s, code)
        assert text_of(r) == f"Out[1]: {size}", text_of(r)[:200]
        return {"ran": True}
    try:
        await s.call_tool("execute_code", {"code": code})
    except MCPError as e:
        assert e.error.code == -32001 and "too large" in e.error.message, e
    else:
        raise AssertionError("a request over the limit was accepted")
    r = await run_cell(s, "40 + 2")
    assert text_of(r) == "Out[1]: 42", text_of(r)
    return {"ran": False}


@scenario
async def budget(s, opts):
    budget = opts.max_chars
    code = "for i in range(20000):\n    print(f'line {i:05d} ' + 'é' * (i % 7))"
    expected = "".join(f"line {i:05d} " + "é" * (i % 7) + "\n" for i in range(20000))
    r = await run_cell(s, code + "\n'x' * 50000")
    t = text_of(r)
    assert len(t) <= budget + 1000, len(t)
    assert t.startswith("line 00000 \n"), t[:50]
    sc = r.structured_content
    cuts = {c["stream"]: c for c in sc["output_cut"]}
    assert set(cuts) == {"stdout", "result"}, sc["output_cut"]
    cut = cuts["stdout"]
    assert cut["total_chars"] == len(expected), (cut, len(expected))
    marker = f'read_output(execution_count=1, stream="stdout", offset={cut["cut_from"]}'
    assert marker in t, t[:3000]
    assert sc["stdout"] in t, "structuredContent carries the same cut text"
    # Page through everything that was cut, then rebuild the whole output.
    pages, offset = [], cut["cut_from"]
    while offset is not None:
        p = await s.call_tool("read_output", {"execution_count": 1, "stream": "stdout",
                                              "offset": offset, "length": 10 ** 9})
        assert not p.is_error, text_of(p)
        page = p.structured_content
        assert page["length"] <= budget and page["offset"] == offset, page
        pages.append(page["text"])
        offset = page["next_offset"]
    head = expected[: cut["head_chars"]]
    rebuilt = head + "".join(pages)
    assert rebuilt == expected, "head + pages == the whole stdout"
    assert sc["stdout"].startswith(head) and sc["stdout"].endswith(expected[-cut["tail_chars"]:])
    p = await s.call_tool("read_output", {"execution_count": 1, "stream": "result",
                                          "offset": 0, "length": 10})
    assert p.structured_content["text"] == "'xxxxxxxxx", p.structured_content
    return {"pages": len(pages), "total_chars": cut["total_chars"]}


@scenario
async def progress(s, opts):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((time.monotonic(), progress, message))

    code = ("import time\nfor i in range(6):\n    print(f'step {i}', flush=True)\n"
            "    time.sleep(0.5)\n'done'")
    t0 = time.monotonic()
    r = await s.call_tool("execute_code", {"code": code}, progress_callback=on_progress)
    assert text_of(r).endswith("Out[1]: 'done'"), text_of(r)
    assert len(seen) >= 2, seen
    values = [p for _, p, _ in seen]
    assert values == sorted(values) and len(set(values)) == len(values), values
    assert seen[0][0] - t0 <= 2.5, "first heartbeat within 2 s (plus slack)"
    gaps = [b[0] - a[0] for a, b in zip(seen, seen[1:], strict=False)]
    assert all(g <= 2.5 for g in gaps), gaps
    assert all("running for" in m for _, _, m in seen), seen
    assert any("last output: step" in m for _, _, m in seen), seen
    messages = [m for _, _, m in seen]
    # No progress is sent when the call has no token.
    seen.clear()
    await run_cell(s, "import time; time.sleep(1.5)")
    assert seen == [], seen
    return {"notifications": len(values), "messages": messages}


@scenario
async def cancel(s, opts):
    await run_cell(s, "kept = 'yes'")
    started = time.monotonic()
    with anyio.move_on_after(1.0):
        await run_cell(s, "import time\ntime.sleep(60)")
    waited = time.monotonic() - started
    assert waited < 5, waited
    t0 = time.monotonic()
    r = await run_cell(s, "kept")
    after = time.monotonic() - t0
    assert not r.is_error and text_of(r).endswith("Out[3]: 'yes'"), text_of(r)
    assert after < 10, f"the next call waited {after:.1f} s: the cancelled cell kept running"
    # A cell queued behind a running one and cancelled never runs.
    async with anyio.create_task_group() as tg:
        tg.start_soon(run_cell, s, "import time; time.sleep(1.5)")
        await anyio.sleep(0.3)
        with anyio.move_on_after(0.3):
            await run_cell(s, "never = 1")
    r = await run_cell(s, "'never' in globals()")
    assert text_of(r).endswith("Out[5]: False"), text_of(r)
    return {"cancel_returned_after_s": round(waited, 2), "next_call_s": round(after, 3)}


@scenario
async def interrupt(s, opts):
    async def call_interrupt():
        await anyio.sleep(0.8)
        return await s.call_tool("interrupt", {})

    results = {}

    async def slow():
        results["cell"] = await run_cell(s, "n = 0\nwhile True:\n    n += 1")

    async def stop():
        results["interrupt"] = await call_interrupt()

    async with anyio.create_task_group() as tg:
        tg.start_soon(slow)
        tg.start_soon(stop)
    cell, intr = results["cell"], results["interrupt"]
    assert intr.structured_content["interrupted"] is True, intr.structured_content
    assert cell.is_error and cell.structured_content["interrupted"] is True, cell.structured_content
    assert cell.structured_content["error"]["type"] == "KeyboardInterrupt"
    r = await run_cell(s, "n > 0")
    assert text_of(r) == "Out[2]: True", text_of(r)
    r = await s.call_tool("interrupt", {})
    assert r.structured_content["interrupted"] is False
    return {}


@scenario
async def stuck(s, opts):
    """In-process: a cell that ignores SIGINT; the call queued behind it is told, not left."""
    results = {}

    async def first():
        results["first"] = await run_cell(
            s, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
               "time.sleep(5)\n'finished'")

    async def second():
        await anyio.sleep(0.5)
        r = await s.call_tool("interrupt", {})
        assert r.structured_content["interrupted"] is True, r.structured_content
        t0 = time.monotonic()
        results["second"] = await run_cell(s, "ran_second = True")
        results["second_s"] = time.monotonic() - t0

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        tg.start_soon(second)
    second = results["second"]
    assert second.is_error and text_of(second).startswith("CellNotStopped"), text_of(second)
    assert results["second_s"] < 4, results["second_s"]
    assert text_of(results["first"]).endswith("Out[1]: 'finished'"), text_of(results["first"])
    r = await run_cell(s, "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                          "'ran_second' in globals()")
    assert text_of(r).endswith("Out[2]: False"), text_of(r)
    return {"second_answered_after_s": round(results["second_s"], 2)}


@scenario
async def variables(s, opts):
    r = await s.call_tool("list_variables", {})
    assert r.structured_content == {"variables": [], "count": 0}, r.structured_content
    await run_cell(s, "import numpy as np\nn = 3\nname = 'abc'\nitems = [1, 2, 3]\n"
                      "grid = np.zeros((2, 3))\nclass Odd:\n    def __repr__(self):\n"
                      "        raise ValueError('no')\nodd = Odd()\nlong = 'z' * 1000")
    r = await s.call_tool("list_variables", {})
    by_name = {v["name"]: v for v in r.structured_content["variables"]}
    assert list(by_name) == sorted(by_name), list(by_name)
    assert by_name["n"] == {"name": "n", "type": "int", "repr": "3"}, by_name["n"]
    assert by_name["items"]["len"] == 3 and by_name["name"]["len"] == 3
    assert by_name["grid"]["shape"] == [2, 3] and by_name["grid"]["module"] == "numpy"
    assert by_name["np"]["type"] == "module"
    assert by_name["odd"]["repr"].startswith("<Odd instance"), by_name["odd"]
    assert len(by_name["long"]["repr"]) <= 120, by_name["long"]
    t = text_of(r)
    assert "grid: ndarray (numpy) shape (2, 3)" in t, t
    r = await s.call_tool("restart_session", {})
    sc = r.structured_content
    assert sc["restarted"] is True and sc["state_lost"] is True, sc
    r = await s.call_tool("list_variables", {})
    assert r.structured_content["count"] == 0, r.structured_content
    r = await run_cell(s, "'n' in globals()")
    assert text_of(r).endswith("False"), text_of(r)
    return {"restart_pid": sc["pid"]}


@scenario
async def checkpoints(s, opts):
    """Checkpoint tools; in worker mode, a crash restores the namespace for the next cell."""
    r = await run_cell(s, "import numpy as np\nclass P:\n    def __init__(self): self.v = 7\n"
                          "p = P()\nsq = lambda v: v * v\narr = np.arange(4)\ngen = (i for i in [1])")
    assert not r.is_error, text_of(r)
    r = await s.call_tool("checkpoint", {})
    c = r.structured_content
    assert not r.is_error and c["checkpoint"] == "auto" and c["full"] is True, c
    assert set(c["saved"]) == {"P", "p", "sq", "arr"} and c["modules"] == ["np"], c
    assert "generator" in c["unsaved"]["gen"] and "not saved: gen" in text_of(r), text_of(r)
    r = await s.call_tool("checkpoint", {"name": "before"})
    assert r.structured_content["checkpoint"] == "before", r.structured_content
    r = await run_cell(s, "arr = arr * 10\ndel sq")
    r = await s.call_tool("list_checkpoints", {})
    names = [cp["name"] for cp in r.structured_content["checkpoints"]]
    assert names == ["auto", "before"], r.structured_content
    assert "before: after cell 1" in text_of(r), text_of(r)
    if opts.worker:
        r = await run_cell(s, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
        assert r.is_error and r.structured_content["state_lost"] is True
        r = await run_cell(s, "(p.v, sq(3) if 'sq' in dir() else None, int(arr.sum()))")
        sc = r.structured_content
        assert sc["restored"] is True and "gen" in sc["lost_vars"], sc
        assert "[restored] restored" in text_of(r), text_of(r)
    r = await s.call_tool("restore_checkpoint", {"name": "before"})
    sc = r.structured_content
    assert sc["restored"] is True and sc["checkpoint"] == "before", sc
    assert "sq" in sc["restored_vars"] and "restored" in text_of(r), text_of(r)
    r = await run_cell(s, "(p.v, sq(3), int(arr.sum()), np.__name__)")
    assert text_of(r) == "Out[%d]: (7, 9, 6, 'numpy')" % r.structured_content["execution_count"], text_of(r)
    r = await s.call_tool("restart_session", {"restore": True})
    sc = r.structured_content
    assert sc["restarted"] is True and sc["restored"] is True and "p" in sc["restored_vars"], sc
    for bad in ({"name": "../x"}, {"nme": "x"}):
        try:
            await s.call_tool("restore_checkpoint", bad)
        except MCPError as e:
            assert e.error.code == -32602, e
        else:
            raise AssertionError(f"{bad} was accepted")
    r = await s.call_tool("restore_checkpoint", {"name": "missing"})
    assert r.is_error and "no checkpoint named" in text_of(r), text_of(r)
    return {"restore_ms": sc["restore_ms"]}


def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@scenario
async def figures(s, opts):
    r = await run_cell(s, "import matplotlib\nmatplotlib.get_backend()")
    assert text_of(r).lower().endswith("'agg'"), text_of(r)
    r = await run_cell(s, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\n"
                          "plt.title('three points')\nprint('plotted')")
    assert not r.is_error, text_of(r)
    images = [c for c in r.content if c.type == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png", r.content
    data = base64.b64decode(images[0].data)
    w, h = png_size(data)
    assert (w, h) == (640, 480), (w, h)
    meta = r.structured_content["images"]
    assert meta == [{"mime": "image/png", "width": 640, "height": 480, "bytes": len(data),
                     "source": "figure 1"}], meta
    assert "[image: figure 1, 640x480 PNG" in text_of(r), text_of(r)
    r = await run_cell(s, "plt.get_fignums()")
    assert text_of(r) == "Out[3]: []", "figures are closed after being returned"
    assert not [c for c in r.content if c.type == "image"]
    # Caps: at most the configured number, each within the pixel limit.
    r = await run_cell(s, f"for k in range({opts.max_images + 2}):\n"
                          "    plt.figure(figsize=(30, 30) if k == 0 else (2, 2))\n"
                          "    plt.plot([k, 0])")
    images = [c for c in r.content if c.type == "image"]
    assert len(images) == opts.max_images, len(images)
    for img in images:
        w, h = png_size(base64.b64decode(img.data))
        assert w * h <= 4_000_000, (w, h)
    # Past the limit: each a resource_link, read whole with resources/read.
    links = [c for c in r.content if c.type == "resource_link"]
    assert len(links) == 2 and all(ln.mime_type == "image/png" for ln in links), r.content
    assert len(r.structured_content["images"]) == opts.max_images + 2
    read = await s.read_resource(links[-1].uri)
    assert png_size(base64.b64decode(read.contents[0].blob)) == (200, 200), read.contents[0].uri
    assert "past the image limit" in text_of(r), text_of(r)
    r = await run_cell(s, "for k in range(60):\n    plt.figure(figsize=(1, 1))")
    assert any("closed without being returned" in w for w in r.structured_content["warnings"])
    # A final value with _repr_png_ is returned too.
    r = await run_cell(s, "import io\nclass Pic:\n    def _repr_png_(self):\n"
                          "        f = plt.figure(figsize=(1, 1)); buf = io.BytesIO()\n"
                          "        f.savefig(buf, format='png', dpi=50); plt.close(f)\n"
                          "        return buf.getvalue()\nPic()")
    images = [c for c in r.content if c.type == "image"]
    assert len(images) == 1, r.content
    assert png_size(base64.b64decode(images[0].data)) == (50, 50)
    assert r.structured_content["images"][0]["source"] == "result"
    # A figure from a failing cell still comes back.
    r = await run_cell(s, "plt.plot([1, 2])\nraise RuntimeError('after plotting')")
    assert r.is_error and [c for c in r.content if c.type == "image"], r.content
    return {}


# The longest a scenario may take (the slowest takes a few seconds).
SCENARIO_SECONDS = 150


@scenario
async def sandboxed(s, opts):
    """`flowrepl mcp --sandbox`: the instructions say what is enforced; no TCP leaves the
    cell (with --sandbox-net it does); numpy and matplotlib figures still work; files land
    in the workspace."""
    ins = opts.init.instructions or ""
    assert "sandboxed" in ins and "Enforced:" in ins and "seccomp" in ins, ins
    port = opts.env_map["SANDBOX_TEST_PORT"]
    res = await run_cell(s, "import socket\ntry:\n    socket.create_connection(('127.0.0.1', "
                         + port + "), timeout=5)\n    r = 'connected'\n"
                         "except OSError as e:\n    r = f'refused {e.errno}'\nr")
    expect = opts.env_map.get("SANDBOX_TEST_EXPECT", "refused")
    assert expect in text_of(res), (expect, text_of(res))
    res = await run_cell(s, "import numpy as np, matplotlib.pyplot as plt, os\n"
                         "plt.plot(np.arange(5) ** 2)\n"
                         "open('made-in-sandbox.txt', 'w').write('x')\nos.getcwd()")
    images = [c for c in res.content if c.type == "image"]
    assert images, res.content
    assert res.structured_content["success"] is True, res.structured_content
    return {"cwd": res.structured_content["result"], "instructions": ins}


@scenario
async def long_cell(s, opts):
    """wait_s answers a cell still running with its id and output so far; wait_cell collects
    it once; the session serves other calls meanwhile in order."""
    code = ("import time\nfor i in range(6):\n    print('line', i, flush=True)\n"
            "    time.sleep(0.5)\n'done'")
    t0 = time.monotonic()
    r = await run_cell(s, code, wait_s=1)
    answered = time.monotonic() - t0
    sc = r.structured_content
    assert not r.is_error and sc["running"] is True, sc
    assert 0.9 < answered < 2.5, answered
    assert "line 0" in sc["stdout"] and sc["stdout_bytes"] >= 7, sc
    assert f"cell={sc['cell']}" in text_of(r), text_of(r)
    cell = sc["cell"]
    r = await s.call_tool("wait_cell", {"cell": cell, "wait_s": 0.3})
    assert r.structured_content["running"] is True, r.structured_content
    r = await s.call_tool("wait_cell", {"cell": cell, "wait_s": 30})
    sc = r.structured_content
    assert sc.get("running") is None and sc["result"] == "'done'", sc
    assert sc["stdout"].count("line") == 6, sc["stdout"]
    try:
        await s.call_tool("wait_cell", {"cell": cell})
    except MCPError as e:
        assert "given once" in str(e), e
    else:
        raise AssertionError("a result was given twice")
    # A queued cell answers running with queued: true, and both results come in order.
    a = await run_cell(s, "time.sleep(1.5)\n'first'", wait_s=0.2)
    b = await run_cell(s, "'second'", wait_s=0.2)
    assert b.structured_content["queued"] is True, b.structured_content
    ra = await s.call_tool("wait_cell", {"cell": a.structured_content["cell"], "wait_s": 30})
    rb = await s.call_tool("wait_cell", {"cell": b.structured_content["cell"], "wait_s": 30})
    assert (ra.structured_content["result"], rb.structured_content["result"]) == ("'first'", "'second'")
    assert ra.structured_content["execution_count"] < rb.structured_content["execution_count"]
    # interrupt with a cell id stops that cell only: a queued one is dropped, a running one
    # interrupted (variables kept); an id that is not running is left alone.
    await run_cell(s, "kept = 7")
    a = await run_cell(s, "time.sleep(30)", wait_s=0.3)
    b = await run_cell(s, "'never'", wait_s=0.1)
    ia, ib = a.structured_content["cell"], b.structured_content["cell"]
    r = await s.call_tool("interrupt", {"cell": ib})
    assert r.structured_content["interrupted"] is True and "will not run" in text_of(r), text_of(r)
    r = await s.call_tool("interrupt", {"cell": ia})
    assert r.structured_content["interrupted"] is True, text_of(r)
    r = await s.call_tool("wait_cell", {"cell": ia, "wait_s": 30})
    assert r.is_error and "KeyboardInterrupt" in text_of(r), text_of(r)
    try:
        await s.call_tool("wait_cell", {"cell": ib, "wait_s": 30})
    except MCPError as e:
        assert "before it ran" in str(e), e
    else:
        raise AssertionError("a dropped cell gave a result")
    r = await s.call_tool("interrupt", {"cell": 999})
    assert r.structured_content["interrupted"] is False, text_of(r)
    r = await run_cell(s, "kept")
    assert text_of(r).startswith("Out[") and text_of(r).endswith("]: 7"), text_of(r)
    return {"answered_s": answered}


@scenario
async def tasks(c, opts):
    """A 2026-07-28 client with the MCP tasks extension (tasks_ext.Tasks): short cells are
    answered at once; a cell outliving wait_s becomes a task whose status message shows its
    output so far and which ends with the cell's result; tasks/cancel interrupts the cell."""
    ext = opts.tasks
    assert c.session.protocol_version == "2026-07-28", c.session.protocol_version
    assert TASKS in (c.session.server_capabilities.extensions or {}), c.session.server_capabilities
    r = await run_cell(c, "x = 5\nx", wait_s=1)
    assert text_of(r) == "Out[1]: 5" and not ext.seen, (text_of(r), ext.seen)
    code = ("import time\nfor i in range(5):\n    print('line', i, flush=True)\n"
            "    time.sleep(0.6)\n'done'")
    r = await run_cell(c, code, wait_s=0.5)
    task = ext.seen[-1]
    sc = r.structured_content
    assert not r.is_error and sc["result"] == "'done'" and sc["stdout"].count("line") == 5, sc
    assert task["first"] == "working" and task["polls"][-1] == "completed", task
    assert "task ends with its result" in task["message"], task["message"]
    assert any(m and "line 3" in m for m in task["messages"]), task["messages"]

    async def stop(session, handle):
        await anyio.sleep(0.5)
        await cancel_task(session, handle.task_id)
    ext.on_task = stop
    t0 = time.monotonic()
    try:
        r = await run_cell(c, "x = 6\nimport time\ntime.sleep(60)", wait_s=0.3)
    except TaskEnded as e:
        assert e.state.status == "cancelled", e.state
    else:
        raise AssertionError(f"the task was not cancelled: {text_of(r)}")
    cancelled_s = time.monotonic() - t0
    assert cancelled_s < 10, cancelled_s
    ext.on_task = None
    r = await run_cell(c, "x")
    assert text_of(r) == "Out[4]: 6", text_of(r)
    # 2026-07-28 has no server-to-client requests: approvals reach the person through the
    # call's InputRequiredResult (the SDK asks the callback and sends the call again), and the
    # cell runs once.
    r = await run_cell(c, "runs = globals().get('runs', 0) + 1\n"
                          "a = flow.request_approval('accept this?')\n"
                          "b = flow.request_approval('decline that?')\n(a, b, runs)")
    assert text_of(r).endswith("Out[5]: (True, False, 1)"), text_of(r)
    assert [q["message"] for q in ASKED] == ["accept this?", "decline that?"], ASKED
    # A requestState this server did not give, or for a cell no longer parked: -32602.
    for state, said in (("bogus", "not one this server gave"), ("cell:999", "no cell 999")):
        try:
            await c.session.call_tool("execute_code", {"code": "1"}, request_state=state,
                                      input_responses={}, allow_input_required=True)
        except MCPError as e:
            assert e.error.code == -32602 and said in str(e), e
        else:
            raise AssertionError(f"requestState {state} was accepted")
    # A task's cell that asks: the task is input_required with the elicitation, and the
    # client's tasks/update answers it.
    async def person(request):
        ASKED.append({"message": request["params"]["message"], "via": "task"})
        return {"action": "accept", "content": {}}
    ext.on_input = person
    r = await run_cell(c, "import time\ntime.sleep(0.8)\nflow.request_approval('accept from a task?')",
                       wait_s=0.3)
    task = ext.seen[-1]
    assert text_of(r).endswith("Out[6]: True"), text_of(r)
    assert "input_required" in task["polls"] and task["answered"], task
    assert ASKED[-1] == {"message": "accept from a task?", "via": "task"}, ASKED
    # A client without an elicitation callback is not asked: None at once.
    async with Client(opts.params) as plain:
        r = await run_cell(plain, "print(flow.request_approval('accept me?'))")
        assert text_of(r).startswith("None") and "elicitation" in text_of(r), text_of(r)
    assert len(ASKED) == 3, ASKED
    return {"tasks": len(ext.seen), "cancelled_s": cancelled_s}


def sha256(data):
    import hashlib
    return hashlib.sha256(data).hexdigest()


@scenario
async def files(s, opts):
    """Files in and out of the workspace: a CSV read by pandas, a PNG and a parquet file a
    cell wrote downloaded byte-equal, a large file as a resource_link read whole with
    resources/read, the template listed, refusals as isError results."""
    csv = "a,b\n1,2\n3,4\n"
    r = await s.call_tool("upload_file", {"path": "data/in.csv", "text": csv})
    assert not r.is_error, text_of(r)
    assert r.structured_content["sha256"] == sha256(csv.encode()), r.structured_content
    r = await run_cell(s, "import pandas as pd\nprint(int(pd.read_csv('data/in.csv')['b'].sum()))")
    assert text_of(r).strip() == "6", text_of(r)
    blob = bytes(range(256)) * 8
    r = await s.call_tool("upload_file", {"path": "bin/raw.dat", "base64": base64.b64encode(blob).decode()})
    assert not r.is_error and r.structured_content["bytes"] == len(blob), text_of(r)
    r = await run_cell(s, """
import hashlib, json, os, duckdb, matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
fig, ax = plt.subplots(); ax.plot([1, 3, 2]); fig.savefig('plot.png'); plt.close(fig)
duckdb.sql("COPY (SELECT range AS n FROM range(1000)) TO 'out.parquet' (FORMAT PARQUET)")
with open('big.bin', 'wb') as f: f.write(os.urandom(3 << 20))
assert open('bin/raw.dat', 'rb').read() == bytes(range(256)) * 8
print(json.dumps({n: hashlib.sha256(open(n, 'rb').read()).hexdigest() for n in ['plot.png', 'out.parquet', 'big.bin']}))
""")
    assert not r.is_error, text_of(r)
    want = json.loads(text_of(r).strip().splitlines()[-1])
    png = await s.call_tool("download_file", {"path": "plot.png"})
    images = [c for c in png.content if c.type == "image"]
    assert images and images[0].mime_type == "image/png", png.content
    assert sha256(base64.b64decode(images[0].data)) == want["plot.png"]
    assert png.structured_content["delivered"] == "image", png.structured_content
    pq = await s.call_tool("download_file", {"path": "out.parquet"})
    res = [c for c in pq.content if c.type == "resource"]
    assert res and res[0].resource.mime_type == "application/vnd.apache.parquet", pq.content
    assert sha256(base64.b64decode(res[0].resource.blob)) == want["out.parquet"]
    text = await s.call_tool("download_file", {"path": "data/in.csv"})
    assert csv in text_of(text) and text.structured_content["delivered"] == "text", text.content
    big = await s.call_tool("download_file", {"path": "big.bin"})
    links = [c for c in big.content if c.type == "resource_link"]
    assert links and links[0].size == 3 << 20, big.content
    read = await s.read_resource(links[0].uri)
    assert sha256(base64.b64decode(read.contents[0].blob)) == want["big.bin"], "resource read differs"
    templates = (await s.list_resource_templates()).resource_templates
    assert [t.uri_template for t in templates] == ["flowrepl://files/{plan}/{task}/{path}"], templates
    listed = {str(r.uri) for r in (await s.list_resources()).resources}
    assert any(u.endswith("/data/in.csv") for u in listed) and any(u.endswith("/plot.png") for u in listed), listed
    page = await s.call_tool("list_files", {"limit": 2})
    assert len(page.structured_content["entries"]) == 2 and page.structured_content["next_cursor"], page.structured_content
    rest = await s.call_tool("list_files", {"cursor": page.structured_content["next_cursor"]})
    names = [e["name"] for e in page.structured_content["entries"] + rest.structured_content["entries"]]
    assert {"data", "plot.png", "out.parquet", "big.bin", "bin"} <= set(names), names
    refused = {}
    for path in ["../outside.txt", "/etc/passwd", "data/../../x", ".flowrepl/x"]:
        r = await s.call_tool("upload_file", {"path": path, "text": "x"})
        assert r.is_error, (path, text_of(r))
        refused[path] = text_of(r)
    r = await s.call_tool("download_file", {"path": "nothing.txt"})
    assert r.is_error and "no such file" in text_of(r), text_of(r)
    # Big output: head and tail in the answer, the whole stream one resources/read away.
    r = await run_cell(s, "import hashlib, sys\nbig = ''.join(f'{i:09d}\\n' for i in range(500_000))\n"
                          "sys.stdout.write(big)\nprint(hashlib.sha256(big.encode()).hexdigest(), file=sys.stderr)")
    stdout_links = [c for c in r.content if c.type == "resource_link" and c.uri.endswith("/stdout")]
    assert stdout_links and stdout_links[0].size == 5_000_000, r.content
    assert len(text_of(r)) < opts.max_chars + 2000, len(text_of(r))
    whole = (await s.read_resource(stdout_links[0].uri)).contents[0].text
    assert sha256(whole.encode()) in r.structured_content["stderr"], "the whole stream differs"
    r = await s.call_tool("delete_file", {"path": "out.parquet"})
    assert not r.is_error, text_of(r)
    r = await run_cell(s, "import os; print(os.path.exists('out.parquet'))")
    assert text_of(r).strip() == "False", text_of(r)
    return {"refused": refused, "sha": want}


@scenario
async def packages(s, opts):
    """install_packages from the test's index (FLOWREPL_INDEX_URL): the next cell imports the
    package; an unknown name and a URL are isError results with the reason."""
    r = await s.call_tool("install_packages", {"packages": ["tinypkg==2.0"]})
    assert not r.is_error, text_of(r)
    sc = r.structured_content
    assert sc["installed"] == ["tinydep==1.0", "tinypkg==2.0"], sc
    assert "the next cell imports them" in text_of(r), text_of(r)
    r = await run_cell(s, "import tinypkg\nprint(tinypkg.VERSION)")
    assert text_of(r).strip() == "2.0", text_of(r)
    refused = {}
    for bad in ["nosuchpkg", "x @ http://127.0.0.1:9/x.whl"]:
        r = await s.call_tool("install_packages", {"packages": [bad]})
        assert r.is_error, text_of(r)
        refused[bad] = text_of(r)
    r = await run_cell(s, "import tinypkg\nprint(tinypkg.VERSION)")
    assert text_of(r).strip() == "2.0", text_of(r)
    # A long install (the index stalls on slowpkg) reports progress, and is stopped at the
    # operator's timeout (FLOWREPL_PACKAGES_TIMEOUT_S) as an isError result.
    seen = []

    async def on_progress(progress, total, message):
        seen.append(message)

    # While it runs, the tools answered at once are: interrupt (nothing to interrupt) and
    # list_files come back before the install ends (at its 3 s timeout).
    result = {}
    at_once = {}

    async def slow():
        result["r"] = await s.call_tool("install_packages", {"packages": ["slowpkg"]},
                                        progress_callback=on_progress)
        result["ended"] = time.monotonic()

    async with anyio.create_task_group() as tg:
        tg.start_soon(slow)
        await anyio.sleep(0.5)
        for tool, args in [("interrupt", {}), ("list_files", {})]:
            t0 = time.monotonic()
            r = await s.call_tool(tool, args)
            at_once[tool] = time.monotonic() - t0
            assert not r.is_error, text_of(r)
            assert "ended" not in result, f"{tool} waited for the install"
    assert all(t < 2.0 for t in at_once.values()), at_once
    r = result["r"]
    assert r.is_error and "did not finish within" in text_of(r), text_of(r)
    assert seen and all(m.startswith("installing for") for m in seen), seen
    return {"installed": sc["installed"], "source": sc["source"], "refused": refused,
            "progress": seen, "at_once": at_once}


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--flowrepl", required=True)
    ap.add_argument("--log-dir", required=True)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--python")
    ap.add_argument("--env", action="append", default=[])
    opts = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    env["FLOWREPL_LOG_DIR"] = opts.log_dir
    env["FLOWREPL_LOG"] = "warn"
    for kv in opts.env:
        k, _, v = kv.partition("=")
        env[k] = v
    opts.env_map = env
    opts.max_chars = int(env.get("FLOWREPL_MCP_MAX_CHARS", "20000"))
    opts.max_images = int(env.get("FLOWREPL_MCP_MAX_IMAGES", "8"))
    args = ["mcp"] + (["--worker"] if opts.worker else [])
    if opts.python:
        args += ["--python", opts.python]
    # Scenarios that write files run in a working directory (the workspace) of their own.
    cwd = tempfile.mkdtemp(prefix="flowrepl-ws-") if opts.scenario in IN_WORKDIR else None
    params = StdioServerParameters(command=opts.flowrepl, args=args, env=env, cwd=cwd)
    # A scenario fails, never hangs: a kernel that stops answering ends it here.
    with anyio.fail_after(SCENARIO_SECONDS):
        await run_scenario(opts, params)


async def run_scenario(opts, params):
    if opts.scenario in MODERN:
        # The SDK's own Client: it negotiates 2026-07-28 (server/discover) and carries the
        # tasks extension.
        opts.tasks = Tasks(poll_s=0.2)
        opts.params = params
        async with Client(params, extensions=[opts.tasks], elicitation_callback=elicit) as c:
            facts = await SCENARIOS[opts.scenario](c, opts)
        print(json.dumps(facts or {}))
        return
    async with stdio_client(params) as (read, write):
        callback = elicit if opts.scenario in ELICITING else None
        async with ClientSession(read, write, elicitation_callback=callback) as s:
            opts.init = await s.initialize()
            facts = await SCENARIOS[opts.scenario](s, opts)
    print(json.dumps(facts or {}))


if __name__ == "__main__":
    anyio.run(main)
