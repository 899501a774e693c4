"""Python's set-diff cycle with N globals: snapshot, exec, snapshot, diffs (globals and
sys.modules, as a Python kernel that reports added/removed names and imports does).
Prints the p50 in microseconds."""
import sys
import time

n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 2_000
g = {f"v{i}": i for i in range(n)}
code = compile("x = 1", "<cell>", "exec")
samples = []
for _ in range(iters):
    t = time.perf_counter()
    before, mods = set(g), set(sys.modules)
    exec(code, g)
    after, mods2 = set(g), set(sys.modules)
    _ = (after - before, before - after, mods2 - mods)
    samples.append(time.perf_counter() - t)
samples.sort()
print(f"{samples[len(samples) // 2] * 1e6:.1f}")
