"""The anchor: a plain Python NDJSON REPL (exec + redirect_stdout), no diff, no log.

Speaks the same JSON-RPC lines as flowrepl so the bench driver treats both alike.
"""
import contextlib
import io
import json
import sys
import traceback

ns = {"__name__": "__main__"}
out = sys.stdout
out.write(json.dumps({"jsonrpc": "2.0", "method": "ready", "params": {"message": "__READY__"}}) + "\n")
out.flush()
for line in sys.stdin:
    req = json.loads(line)
    code = req["params"]["code"]
    so, se = io.StringIO(), io.StringIO()
    ok, err = True, None
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        try:
            exec(code, ns)
        except BaseException as e:
            ok, err = False, {"type": type(e).__name__, "message": str(e)}
            traceback.print_exc()
    result = {"success": ok, "stdout": so.getvalue(), "stderr": se.getvalue(), "error": err}
    out.write(json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": result}) + "\n")
    out.flush()
