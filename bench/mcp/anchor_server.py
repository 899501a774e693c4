"""The anchor: an MCP server in Python with the official SDK (MCPServer), serving the same
`execute_code` tool the simple way: exec in a persistent namespace with redirect_stdout.
Run by bench/mcp/bench.py (stdio) and bench/mcp/serve_bench.py (`--http PORT`); not part of
flowrepl."""
import ast
import contextlib
import io

from mcp.server.mcpserver import MCPServer

server = MCPServer("python-anchor")
namespace = {"__name__": "__main__"}


@server.tool()
def execute_code(code: str) -> str:
    """Run Python code in a persistent namespace; return stdout, stderr and the last value."""
    out, err = io.StringIO(), io.StringIO()
    value = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            tree = ast.parse(code)
            last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            if last is not None:
                tree.body.pop()
            exec(compile(tree, "<cell>", "exec"), namespace)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
        except BaseException as e:  # noqa: BLE001 - report like a REPL
            err.write(f"{type(e).__name__}: {e}\n")
    text = out.getvalue() + err.getvalue()
    if value is not None:
        text += repr(value)
    return text


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        # bench/mcp/serve_bench.py: the same server over streamable HTTP.
        server.settings.log_level = "WARNING"
        server.run("streamable-http", port=int(sys.argv[2]))
    else:
        server.run()
