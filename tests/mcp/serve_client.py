"""Checks of `flowrepl serve`, driven by the official Python SDK's streamable HTTP client.

Usage: serve_client.py SCENARIO --url URL --token TOKEN --serve-pid PID

Each scenario talks to a running server as MCP clients would (several at once where it
says so), raises AssertionError with the evidence when something is off, and on success
prints one JSON line of facts for the Rust test to check further (logs, processes).
"""
import argparse
import json
import os
import signal
import time

import anyio
import httpx2
import mcp.types as types
from mcp import ClientSession
from mcp.client import Client as SdkClient
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from tasks_ext import TASKS, TaskEnded, Tasks
from tasks_ext import cancel as cancel_task

SCENARIOS = {}
SCENARIO_SECONDS = 300


def scenario(f):
    SCENARIOS[f.__name__] = f
    return f


def text_of(res):
    return "".join(c.text for c in res.content if c.type == "text")


class Client:
    """One MCP client (its own HTTP connection pool and MCP session)."""

    def __init__(self, opts, timeout=120, elicitation_callback=None):
        self.opts = opts
        self.timeout = timeout
        self.elicitation_callback = elicitation_callback

    async def __aenter__(self):
        self._http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {self.opts.token}"}, timeout=self.timeout)
        await self._http.__aenter__()
        self._transport = streamable_http_client(self.opts.url, http_client=self._http)
        read, write, *_ = await self._transport.__aenter__()
        self._session = ClientSession(read, write,
                                      elicitation_callback=self.elicitation_callback)
        s = await self._session.__aenter__()
        self.init = await s.initialize()
        return s

    async def __aexit__(self, *exc):
        await self._session.__aexit__(*exc)
        await self._transport.__aexit__(*exc)
        await self._http.__aexit__(*exc)


class Modern:
    """The SDK's own Client, which negotiates 2026-07-28 (server/discover, no session),
    with the given extensions."""

    def __init__(self, opts, extensions=(), elicitation_callback=None):
        self.opts = opts
        self.extensions = list(extensions)
        self.elicitation_callback = elicitation_callback

    async def __aenter__(self):
        self._http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {self.opts.token}"}, timeout=120)
        await self._http.__aenter__()
        transport = streamable_http_client(self.opts.url, http_client=self._http)
        self._client = SdkClient(transport, extensions=self.extensions,
                                 elicitation_callback=self.elicitation_callback)
        return await self._client.__aenter__()

    async def __aexit__(self, *exc):
        await self._client.__aexit__(*exc)
        await self._http.__aexit__(*exc)


async def run(s, task, code, **kw):
    return await s.call_tool("execute_code", {"code": code, "task": task, **kw})


async def ok(s, task, code, **kw):
    r = await run(s, task, code, **kw)
    assert not r.is_error, (task, code, text_of(r))
    return r


async def kernels(s):
    r = await s.call_tool("list_kernels", {})
    return {k["task"]: k for k in r.structured_content["kernels"]}


async def wait_checkpoint(s, task, cells):
    """Until the task's automatic checkpoint holds cell `cells` (it is written off the
    request path)."""
    for _ in range(200):
        r = await s.call_tool("list_checkpoints", {"task": task})
        cps = r.structured_content["checkpoints"]
        if any(c["name"] == "auto" and c["execution_count"] >= cells for c in cps):
            return
        await anyio.sleep(0.05)
    raise AssertionError(f"{task}: no checkpoint after cell {cells}")


@scenario
async def auth(opts):
    """No token, a wrong token, a foreign Origin or Host: refused before MCP; then served."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    good = {"Authorization": f"Bearer {opts.token}", **accept}
    got = {}
    async with httpx2.AsyncClient(timeout=30) as h:
        for name, headers in [
            ("none", accept),
            ("wrong", {"Authorization": "Bearer not-the-token-at-all-0000", **accept}),
            ("basic", {"Authorization": f"Basic {opts.token}", **accept}),
            ("origin", {**good, "Origin": "http://evil.example"}),
            ("local-origin", {**good, "Origin": "http://localhost:3000"}),
            ("host", {**good, "Host": "evil.example"}),
            ("good", good),
        ]:
            r = await h.post(opts.url, json=body, headers=headers)
            got[name] = r.status_code
            if name in ("none", "wrong"):
                assert r.headers.get("www-authenticate", "").startswith("Bearer"), r.headers
    assert got["none"] == got["wrong"] == got["basic"] == 401, got
    assert got["origin"] == got["host"] == 403, got
    assert got["good"] == got["local-origin"] == 200, got
    async with Client(opts) as s:
        r = await ok(s, "auth", "6 * 7")
        assert r.structured_content["result"] == "42", r.structured_content
    return {"status": got}


@scenario
async def tools(opts):
    async with Client(opts) as s:
        listed = {t.name: t for t in (await s.list_tools()).tools}
        for t in ("execute_code", "read_output", "interrupt", "restart_session",
                  "list_variables", "checkpoint", "restore_checkpoint", "list_checkpoints",
                  "wait_cell"):
            props = listed[t].input_schema["properties"]
            assert "task" in props and "plan" in props, (t, props)
        assert "list_kernels" in listed and "stop_kernel" in listed, sorted(listed)
        try:
            await s.call_tool("execute_code", {"code": "1", "task": 5})
        except MCPError as e:
            assert "task must be a non-empty string" in str(e), e
        else:
            raise AssertionError("a task that is not a string was taken")
    return {"tools": sorted(listed)}


@scenario
async def isolation(opts):
    """Two tasks used at once: each its own variables, working directory and kernel."""
    async with Client(opts) as s:
        async def use(task, value):
            await ok(s, task, f"import os\nv = {value}\nopen('mine.txt', 'w').write('{task}')")
            await anyio.sleep(0.2)
            r = await ok(s, task, "(v, sorted(os.listdir('.')), os.getcwd())")
            return r.structured_content["result"]

        results = {}

        async def one(task, value):
            results[task] = await use(task, value)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "iso-a", 1)
            tg.start_soon(one, "iso-b", 2)
        assert results["iso-a"].startswith("(1, ['mine.txt'], "), results
        assert results["iso-b"].startswith("(2, ['mine.txt'], "), results
        assert results["iso-a"] != results["iso-b"]
        ks = await kernels(s)
        assert ks["iso-a"]["pid"] != ks["iso-b"]["pid"], ks
        assert ks["iso-a"]["cells"] == 2 and ks["iso-a"]["state"] == "idle", ks
        assert ks["iso-a"]["memory_kb"] > 1000, ks
        await wait_checkpoint(s, "iso-a", 2)
        await wait_checkpoint(s, "iso-b", 2)
    return {"results": results, "kernels": ks}


@scenario
async def crowd(opts):
    """50 clients at once, 20 calls each, on 10 tasks: every reply is the caller's."""
    clients, calls, tasks = opts.clients, opts.calls, opts.tasks
    bad = []
    durations = []

    async def client(n):
        async with Client(opts) as s:
            task = f"crowd-{n % tasks}"
            for i in range(calls):
                value = n * 1000 + i
                t0 = time.perf_counter()
                r = await run(s, task, f"c{n}_{i} = {value}\nc{n}_{i}")
                durations.append(time.perf_counter() - t0)
                got = (r.structured_content or {}).get("result")
                if r.is_error or got != str(value):
                    bad.append((n, i, got, text_of(r)[:200]))

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for n in range(clients):
            tg.start_soon(client, n)
    wall = time.perf_counter() - t0
    assert not bad, bad[:5]
    durations.sort()
    return {"calls": clients * calls, "wall_s": wall,
            "p50_ms": durations[len(durations) // 2] * 1000,
            "p99_ms": durations[int(len(durations) * 0.99)] * 1000}


@scenario
async def killed(opts):
    """A kernel SIGKILLed from outside: the next call is restored from its checkpoint."""
    async with Client(opts) as s:
        await ok(s, "victim", "import math\nkept = [1, 2, 3]\nfrom_math = math.pi")
        await wait_checkpoint(s, "victim", 1)
        pid = (await kernels(s))["victim"]["pid"]
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if (await kernels(s)).get("victim", {}).get("state") == "exited":
                break
            await anyio.sleep(0.05)
        r = await ok(s, "victim", "(kept, round(from_math, 2))")
        sc = r.structured_content
        assert sc["result"] == "([1, 2, 3], 3.14)", sc
        assert sc["restored"] is True, sc
        new = (await kernels(s))["victim"]["pid"]
        assert new != pid
        # Killed during a call: that call is an isError result saying so; the next restores.
        answer = {}

        async def long():
            answer["r"] = await run(s, "victim", "import time\ntime.sleep(30)")

        async with anyio.create_task_group() as tg:
            tg.start_soon(long)
            await anyio.sleep(1)
            os.kill(new, signal.SIGKILL)
        assert answer["r"].is_error, answer
        assert "the task's kernel exited during the call" in text_of(answer["r"]), text_of(answer["r"])
        r = await ok(s, "victim", "kept")
        assert r.structured_content["restored"] is True, r.structured_content
    return {"old_pid": pid, "new_pid": new}


@scenario
async def idle(opts):
    """A kernel idle past --idle-stop is checkpointed and stopped; the next call resumes it."""
    async with Client(opts) as s:
        await ok(s, "sleepy", "value = 'still here'")
        pid = (await kernels(s))["sleepy"]["pid"]
        for _ in range(200):
            if "sleepy" not in await kernels(s):
                break
            await anyio.sleep(0.1)
        else:
            raise AssertionError(f"not stopped: {await kernels(s)}")
        r = await ok(s, "sleepy", "value")
        sc = r.structured_content
        assert sc["result"] == "'still here'" and sc["restored"] is True, sc
        assert (await kernels(s))["sleepy"]["pid"] != pid
    return {"pid": pid}


@scenario
async def evict(opts):
    """At --max-kernels 2: the least recently used idle kernel makes room (and comes back
    restored); with both busy, a call on a third task gets a clear error."""
    async with Client(opts) as s:
        await ok(s, "ev-a", "a = 1")
        await ok(s, "ev-b", "b = 2")
        await ok(s, "ev-a", "a += 1")
        await ok(s, "ev-c", "c = 3")
        ks = await kernels(s)
        assert sorted(ks) == ["ev-a", "ev-c"], ks
        r = await ok(s, "ev-b", "b")
        assert r.structured_content["restored"] is True and r.structured_content["result"] == "2"
        assert sorted(await kernels(s)) == ["ev-b", "ev-c"]
        full = {}

        async def busy(task):
            await ok(s, task, "import time\ntime.sleep(3)")

        async def third():
            await anyio.sleep(1)
            full["r"] = await run(s, "ev-d", "1")

        async with anyio.create_task_group() as tg:
            tg.start_soon(busy, "ev-b")
            tg.start_soon(busy, "ev-c")
            tg.start_soon(third)
        r = full["r"]
        assert r.is_error and "--max-kernels" in text_of(r), text_of(r)
        r = await ok(s, "ev-d", "'room now'")
    return {}


@scenario
async def three_minutes(opts):
    """A 3 minute cell through wait_s/wait_cell, with a client whose request timeout is 60 s
    (every call must answer within it)."""
    code = ("import time\nfor i in range(180):\n    print('minute', i // 60, 'second', i % 60, flush=True)\n"
            "    time.sleep(1)\n'three minutes'")
    calls = []
    async with Client(opts, timeout=60) as s:
        t0 = time.monotonic()
        r = await s.call_tool("execute_code", {"code": code, "task": "long"},
                              read_timeout_seconds=60)
        calls.append(time.monotonic() - t0)
        while (r.structured_content or {}).get("running"):
            cell = r.structured_content["cell"]
            t0 = time.monotonic()
            r = await s.call_tool("wait_cell", {"cell": cell, "task": "long"},
                                  read_timeout_seconds=60)
            calls.append(time.monotonic() - t0)
        sc = r.structured_content
        assert not r.is_error and sc["result"] == "'three minutes'", (text_of(r)[:300], sc)
        assert sc["stdout"].count("\n") == 180, sc["stdout"][-300:]
    assert max(calls) < 60 and len(calls) >= 4, calls
    return {"calls": calls}


@scenario
async def cannot_start(opts):
    """A kernel that cannot start: an error result, twice (no state kept), server still up."""
    async with Client(opts) as s:
        said = []
        for _ in range(2):
            r = await run(s, "broken", "1")
            assert r.is_error, text_of(r)
            said.append(text_of(r))
        assert (await kernels(s)) == {} or all(
            k["state"] == "exited" for k in (await kernels(s)).values()), await kernels(s)
    return {"said": said[1]}


@scenario
async def big(opts):
    """A 5 MB cell (past rmcp's default 4 MiB body cap) runs."""
    async with Client(opts) as s:
        r = await ok(s, "big", "s = '" + "x" * 5_000_000 + "'\nlen(s)")
        assert r.structured_content["result"] == "5000000", r.structured_content
    return {}


@scenario
async def too_big(opts):
    """A request over --max-request-bytes gets 413, and the server goes on."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "execute_code", "arguments": {"code": "#" * 2_000_000}}})
    async with httpx2.AsyncClient(timeout=30) as h:
        r = await h.post(opts.url, content=body, headers={
            "Authorization": f"Bearer {opts.token}", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream"})
    assert r.status_code == 413, (r.status_code, r.text[:200])
    async with Client(opts) as s:
        await ok(s, "small", "1")
    return {"status": r.status_code}


@scenario
async def approval(opts):
    """A cell's flow.request_approval reaches the client of its call (elicitation), through
    the server's relay, and the answer reaches the cell; a client without elicitation makes
    the approval cancelled."""
    asked = []

    async def person(ctx, params):
        asked.append(params.message)
        word = params.message.split()[0]
        return types.ElicitResult(action="accept" if word == "accept" else "decline",
                                  content={"comment": "ok"} if word == "accept" else None)

    async with Client(opts, elicitation_callback=person) as s:
        r = await ok(s, "approve", "flow.request_approval('accept the deploy?')")
        assert r.structured_content["result"] == "True", r.structured_content
        r = await ok(s, "approve", "flow.request_approval('decline the deploy?')")
        assert r.structured_content["result"] == "False", r.structured_content
    assert [a.split()[0] for a in asked] == ["accept", "decline"], asked
    async with Client(opts) as s:
        r = await run(s, "approve", "flow.request_approval('accept again?')")
        assert r.is_error and "ApprovalCancelled" in text_of(r), text_of(r)
    return {"asked": asked}


@scenario
async def secrets(opts):
    """What a cell can learn of the server's token: not from its environment; the token file
    only without the sandbox."""
    code = ("import os\n"
            "def readable(p):\n"
            "    try:\n"
            "        return len(open(p).read()) > 0\n"
            "    except OSError:\n"
            "        return False\n"
            f"('FLOWREPL_TOKEN' in os.environ, readable({opts.token_file!r}))")
    async with Client(opts) as s:
        r = await ok(s, "secrets", code)
        mode = (await kernels(s))["secrets"]["mode"]
        r2 = await ok(s, "secrets", "import os\nos.getpid() != 2")
    return {"seen": r.structured_content["result"], "mode": mode,
            "pid_not_2": r2.structured_content["result"]}


@scenario
async def cancel(opts):
    """A call cancelled by the client interrupts its cell; the kernel keeps its state."""
    async with Client(opts) as s:
        await ok(s, "cancel", "x = 1")
        t0 = time.perf_counter()
        with anyio.move_on_after(1.5):
            await run(s, "cancel", "import time\nfor i in range(600):\n    time.sleep(0.1)\nx = 2")
        for _ in range(100):
            if (await kernels(s))["cancel"]["state"] == "idle":
                break
            await anyio.sleep(0.05)
        stopped_after = time.perf_counter() - t0
        r = await ok(s, "cancel", "x")
        assert r.structured_content["result"] == "1", r.structured_content
    return {"stopped_after_s": stopped_after}


@scenario
async def modern(opts):
    """2026-07-28 clients (the SDK's default Client): cells, tasks and long cells work as for
    handshake clients; with the tasks extension a cell outliving wait_s becomes an MCP task
    (its status message shows the output so far) while other tasks' calls go on, and
    tasks/cancel interrupts the cell."""
    code = ("import time\nfor i in range(5):\n    print('line', i, flush=True)\n"
            "    time.sleep(0.6)\n'done'")
    async with Modern(opts) as c:
        assert c.session.protocol_version == "2026-07-28", c.session.protocol_version
        assert TASKS in (c.session.server_capabilities.extensions or {})
        await ok(c, "m-a", "x = 1")
        await ok(c, "m-b", "x = 2")
        assert (await ok(c, "m-a", "x")).structured_content["result"] == "1"
        assert (await ok(c, "m-b", "x")).structured_content["result"] == "2"
        assert set(await kernels(c)) == {"m-a", "m-b"}
        r = await ok(c, "m-a", code, wait_s=0.5)
        assert r.structured_content["running"] is True, r.structured_content
        r = await c.call_tool("wait_cell", {"cell": r.structured_content["cell"], "task": "m-a",
                                            "wait_s": 30})
        assert r.structured_content["result"] == "'done'", r.structured_content
    ext = Tasks(poll_s=0.2)
    async with Modern(opts, [ext]) as c:
        quick = []

        async def other_task():
            await anyio.sleep(0.8)
            t0 = time.perf_counter()
            await ok(c, "m-b", "x")
            quick.append(time.perf_counter() - t0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(other_task)
            r = await ok(c, "m-a", code, wait_s=0.5)
        task = ext.seen[-1]
        assert r.structured_content["result"] == "'done'", r.structured_content
        assert r.structured_content["stdout"].count("line") == 5, r.structured_content
        assert task["polls"][-1] == "completed", task
        assert any(m and "line 3" in m for m in task["messages"]), task["messages"]

        async def stop(session, handle):
            await anyio.sleep(0.5)
            await cancel_task(session, handle.task_id)
        ext.on_task = stop
        t0 = time.perf_counter()
        try:
            r = await run(c, "m-a", "x = 9\nimport time\ntime.sleep(60)", wait_s=0.3)
        except TaskEnded as e:
            assert e.state.status == "cancelled", e.state
        else:
            raise AssertionError(f"the task was not cancelled: {text_of(r)}")
        cancelled_s = time.perf_counter() - t0
        ext.on_task = None
        assert (await ok(c, "m-a", "x")).structured_content["result"] == "9"
        # Without an elicitation callback, an approval is cancelled, saying why.
        r = await run(c, "m-b", "flow.request_approval('Deploy?')")
        assert r.is_error and "ApprovalCancelled" in text_of(r) and "elicitation" in text_of(r), \
            text_of(r)
    # No server-to-client requests in 2026-07-28: approvals go in the call's answer
    # (inputRequests), the SDK asks the person and sends the call again; the cell runs once.
    asked = []

    async def person(ctx, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept" if params.message.startswith("accept") else "decline")

    async def task_person(request):
        asked.append(request["params"]["message"])
        return {"action": "accept"}

    ext2 = Tasks(poll_s=0.2, on_input=task_person)
    async with Modern(opts, [ext2], elicitation_callback=person) as c:
        r = await ok(c, "m-b", "runs = globals().get('runs', 0) + 1\n"
                               "(flow.request_approval('accept this?'), "
                               "flow.request_approval('decline that?'), runs)")
        assert r.structured_content["result"] == "(True, False, 1)", r.structured_content
        # A task's cell that asks: input_required, answered with tasks/update.
        r = await ok(c, "m-b", "import time\ntime.sleep(0.8)\n"
                               "flow.request_approval('accept from a task?')", wait_s=0.3)
        assert r.structured_content["result"] == "True", r.structured_content
        assert "input_required" in ext2.seen[-1]["polls"], ext2.seen
    assert asked == ["accept this?", "decline that?", "accept from a task?"], asked
    return {"tasks": len(ext.seen), "quick_s": quick, "cancelled_s": cancelled_s}


@scenario
async def relay_state(opts):
    """A 2026-07-28 client's approval round: the requestState that continues its call is
    unguessable and bound to the call's tool. Another client with the same token that sends
    the call's number (the old `relay:<n>`) or a wrong secret is refused as unknown, and so
    is the right state with another tool; none of them answers the approval or gets the
    result, and the first client's call goes on as if they had not happened."""
    modern = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
              "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
    headers = {"Authorization": f"Bearer {opts.token}", "MCP-Protocol-Version": "2026-07-28",
               "Accept": "application/json, text/event-stream"}
    ids = iter(range(1, 100))

    async def call(http, tool, args, **extra):
        body = {"jsonrpc": "2.0", "id": next(ids), "method": "tools/call",
                "params": {"name": tool, "arguments": args, "_meta": modern, **extra}}
        r = await http.post(opts.url, json=body,
                            headers={**headers, "Mcp-Method": "tools/call", "Mcp-Name": tool})
        assert r.status_code == 200, (r.status_code, r.text)
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            data = [line[5:] for line in r.text.splitlines() if line.startswith("data:")]
            replies = [json.loads(d) for d in data if d.strip()]
            return next(m for m in replies if m.get("id") == body["id"])
        return r.json()

    async with httpx2.AsyncClient(timeout=60) as owner, httpx2.AsyncClient(timeout=60) as other:
        code = "flow.request_approval('accept this?')"
        r = await call(owner, "execute_code", {"task": "relay", "code": code})
        result = r["result"]
        state, requests = result["requestState"], result["inputRequests"]
        assert state.startswith("relay:") and len(requests) == 1, result
        number = state.split(":")[1]
        accept = {key: {"action": "accept"} for key in requests}
        refused = {}
        attempts = {
            "number": (f"relay:{number}", "execute_code"),
            "wrong secret": (f"relay:{number}:{'0' * 32}", "execute_code"),
            "other tool": (state, "wait_cell"),
        }
        for name, (guess, tool) in attempts.items():
            r = await call(other, tool, {"task": "relay", "cell": 1} if tool == "wait_cell"
                           else {"task": "relay", "code": code},
                           requestState=guess, inputResponses=accept)
            assert "error" in r and r["error"]["code"] == -32602, (name, r)
            refused[name] = r["error"]["message"]
        # The owner's round: its answer reaches the cell, and only now the result comes.
        r = await call(owner, "execute_code", {"task": "relay", "code": code},
                       requestState=state, inputResponses=accept)
        assert r["result"]["structuredContent"]["result"] == "True", r
        # Given once.
        r = await call(owner, "execute_code", {"task": "relay", "code": code},
                       requestState=state, inputResponses=accept)
        assert "error" in r, r
    return {"state": state, "refused": refused}


@scenario
async def kept_output(opts):
    """A cell prints 3,000,000 characters (cut to the output budget); read_output asks for
    the rest: whether the kernel kept it, and what it said."""
    async with Client(opts) as s:
        r = await ok(s, "kept", "print('x' * 3_000_000)")
        n = r.structured_content["execution_count"]
        r = await s.call_tool("read_output", {"task": "kept", "execution_count": n,
                                              "stream": "stdout", "offset": 0, "length": 100})
        return {"held": not r.is_error, "text": text_of(r)}


@scenario
async def big_reply(opts):
    """A kernel's reply over the server's message limit: the call gets an error naming it,
    and the task's next call is answered as usual."""
    async with Client(opts) as s:
        try:
            r = await run(s, "big", "print('x' * 3_000_000)")
            error = None if r.is_error is False else text_of(r)
        except MCPError as e:
            error = str(e)
        r = await ok(s, "big", "1 + 1")
        return {"error": error, "after": r.structured_content["result"]}


@scenario
async def shutdown(opts):
    """SIGTERM while cells run: they finish (within the kill grace) and answer; a call queued
    behind one of them is refused without running ("the server is shutting down")."""
    async with Client(opts) as s:
        await ok(s, "down-a", "a = 1")
        await ok(s, "down-b", "b = 1")
        answers = {}

        async def long(task):
            r = await run(s, task, "import time\ntime.sleep(1)\n'finished'")
            answers[task] = (r.is_error, (r.structured_content or {}).get("result"))

        async def queued():
            await anyio.sleep(0.2)
            r = await run(s, "down-a", "queued_ran = True\n'queued'")
            answers["queued"] = (r.is_error, text_of(r))

        async def term():
            await anyio.sleep(0.4)
            os.kill(opts.serve_pid, signal.SIGTERM)

        async with anyio.create_task_group() as tg:
            tg.start_soon(long, "down-a")
            tg.start_soon(long, "down-b")
            tg.start_soon(queued)
            tg.start_soon(term)
        assert answers == {
            "down-a": (False, "'finished'"),
            "down-b": (False, "'finished'"),
            "queued": (True, "not run: the server is shutting down"),
        }, answers
    return {"answers": answers}


@scenario
async def calls(opts):
    """`execute_code` with each --code in order on one connection (at --url, which may be a
    task's own URL: no `task` then unless --task is given), then, with --other-task, one
    call naming another task, which a task's own URL refuses (-32602). Prints each result."""
    results = []
    async with Client(opts) as s:
        for code in opts.code:
            args = {"code": code}
            if opts.task:
                args["task"] = opts.task
            r = await s.call_tool("execute_code", args)
            sc = r.structured_content or {}
            results.append({"is_error": bool(r.is_error), "text": text_of(r),
                            "restored": sc.get("restored"),
                            "restored_vars": sc.get("restored_vars")})
        refused = None
        if opts.other_task:
            try:
                await s.call_tool("execute_code", {"code": "1", "task": opts.other_task})
            except MCPError as e:
                refused = {"code": e.error.code, "message": e.error.message}
    return {"results": results, "refused": refused}


@scenario
async def files(opts):
    """The file tools and resources on a task whose kernel is stopped: served by the server
    itself (no kernel starts)."""
    task = {"task": opts.task, "plan": opts.plan}
    async with Client(opts) as s:
        r = await s.call_tool("upload_file", {"path": "via-mcp.txt", "text": "from mcp", **task})
        assert not r.is_error, text_of(r)
        r = await s.call_tool("list_files", task)
        listed = [e["name"] for e in r.structured_content["entries"]]
        assert "via-mcp.txt" in listed, listed
        r = await s.call_tool("download_file", {"path": "via-mcp.txt", **task})
        assert "from mcp" in text_of(r), text_of(r)
        r = await s.call_tool("download_file", {"path": "leak", **task})
        assert r.is_error and "symbolic link" in text_of(r), text_of(r)
        uri = f"flowrepl://files/{opts.plan}/{opts.task}/via-mcp.txt"
        read = await s.read_resource(uri)
        assert read.contents[0].text == "from mcp", read.contents
        templates = (await s.list_resource_templates()).resource_templates
        assert templates[0].uri_template == "flowrepl://files/{plan}/{task}/{path}", templates
        kernels = (await s.call_tool("list_kernels", {})).structured_content["kernels"]
        assert kernels == [], kernels
    return {"listed": listed}


@scenario
async def packages(opts):
    """install_packages for one task (its kernel's layer): that task imports the package, the
    other task does not have it."""
    task = {"task": opts.task, "plan": opts.plan}
    other = {"task": opts.other_task, "plan": opts.plan}
    async with Client(opts) as s:
        r = await s.call_tool("install_packages", {"packages": ["tinypkg==2.0"], **task})
        assert not r.is_error, text_of(r)
        installed = r.structured_content["installed"]
        assert installed == ["tinydep==1.0", "tinypkg==2.0"], r.structured_content
        r = await s.call_tool("execute_code", {"code": "import tinypkg; print(tinypkg.VERSION)", **task})
        assert text_of(r).strip().startswith("2.0"), text_of(r)
        r = await s.call_tool("execute_code", {"code": "import tinypkg", **other})
        assert r.is_error and "ModuleNotFoundError" in text_of(r), text_of(r)
    return {"installed": installed}


@scenario
async def net(opts):
    """The same cell (--code) in two tasks of the plan: what each printed or raised."""
    said = {}
    async with Client(opts) as s:
        for key, task in [("task", opts.task), ("other", opts.other_task)]:
            r = await s.call_tool("execute_code", {"code": opts.code[0], "task": task,
                                                   "plan": opts.plan})
            said[key] = text_of(r)
    return said


@scenario
async def output_link(opts):
    """A cut stream's resource_link, read through the server from the task's kernel."""
    task = {"task": opts.task, "plan": opts.plan}
    async with Client(opts) as s:
        r = await s.call_tool("execute_code", {"code": "print('x' * 300_000)", **task})
        links = [c for c in r.content if c.type == "resource_link"]
        assert links and links[0].uri.endswith("/stdout"), r.content
        whole = (await s.read_resource(links[0].uri)).contents[0].text
        assert whole == "x" * 300_000 + "\n", len(whole)
        await s.call_tool("stop_kernel", task)
        try:
            await s.read_resource(links[0].uri)
            raise AssertionError("a stopped kernel's output was read")
        except MCPError as e:
            stopped = str(e)
    return {"stopped": stopped}


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--serve-pid", type=int, required=True)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--token-file", default="")
    ap.add_argument("--code", action="append", default=[])
    ap.add_argument("--task", default="")
    ap.add_argument("--other-task", default="")
    ap.add_argument("--plan", default="")
    opts = ap.parse_args()
    with anyio.fail_after(SCENARIO_SECONDS):
        facts = await SCENARIOS[opts.scenario](opts)
    print(json.dumps(facts or {}))


if __name__ == "__main__":
    anyio.run(main)
