"""`flowrepl log stats --json` over about 1 GB of task log (1,000,000 records), next to the
same summary computed by pandas and by DuckDB over the same files, in one run.

Usage: log_stats.py --flowrepl target/release/flowrepl [--records N] [--quick]
The logs are generated once into target/bench-logs/<N>/ (10 tasks of one plan; realistic
execution records of about 1 KB, 5% failing, an event record every 10 cells) and reused.
Peak RSS is each process's own maximum (wait4 for flowrepl; this process's for pandas and
DuckDB, measured in child processes).
"""
import argparse
import json
import os
import pathlib
import random
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def generate(dir, n):
    stamp = dir / ".complete"
    if stamp.exists():
        return
    dir.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(7)
    errors = ["ValueError", "KeyError", "ZeroDivisionError", "TypeError"]
    modules = [["json"], ["numpy", "numpy.core"], [], [], ["pandas"], []]
    tasks = 10
    per = n // tasks
    for t in range(tasks):
        path = dir / "plan-bench" / f"task-{t}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        session = f"{t:08d}-0000-4000-8000-000000000000"
        with open(path, "w") as f:
            written = 0
            count = 0
            while written < per:
                count += 1
                fail = rnd.random() < 0.05
                rec = {
                    "type": "execution", "version": 1, "plan_id": "plan-bench", "task_id": f"task-{t}",
                    "task_name": None, "session_id": session, "execution_count": count,
                    "timestamp": f"2026-11-23T10:{count // 60000 % 60:02d}:{count // 1000 % 60:02d}.{count % 1000:03d}Z",
                    "elapsed_ms": round(rnd.lognormvariate(0.5, 1.2), 3),
                    "code": f"result_{count} = compute({count}, scale=0.5)\nprint(result_{count})",
                    "stdout": ("row %d: " % count) + "x" * 760 + "\n",
                    "stderr": "", "success": not fail,
                    "error_type": rnd.choice(errors) if fail else None,
                    "error_message": "bad value" if fail else None,
                    "result": None, "timed_out": False, "interrupted": False, "stopped_by": None,
                    "added_vars": [f"result_{count}"], "removed_vars": [],
                    "added_imports": rnd.choice(modules), "mode": "in_process", "warnings": [],
                    "pid": 4242, "cpu_ms": round(rnd.uniform(0.01, 2.0), 3), "peak_rss_kb": rnd.randint(20000, 90000),
                    "state_lost": False,
                }
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
                written += 1
                if count % 10 == 0 and written < per:
                    ev = {"type": "event", "version": 1, "plan_id": "plan-bench", "task_id": f"task-{t}",
                          "task_name": None, "session_id": session, "execution_count": count, "seq": 1,
                          "name": "progress", "data": {"pct": count % 100}, "timestamp": rec["timestamp"], "step": None}
                    f.write(json.dumps(ev, separators=(",", ":")) + "\n")
                    written += 1
    stamp.write_text("ok")


PANDAS = r"""
import glob, sys, resource, pandas as pd
cells = failures = 0
elapsed = []
cpu = 0.0
rss = 0
errors = {}
for f in sorted(glob.glob(sys.argv[1] + "/*/*.jsonl")):
    for df in pd.read_json(f, lines=True, chunksize=200_000):
        c = df[df.type == "execution"]
        cells += len(c)
        bad = c[~c.success.astype(bool)]
        failures += len(bad)
        for k, v in bad.error_type.value_counts().items():
            errors[k] = errors.get(k, 0) + int(v)
        elapsed.append(c.elapsed_ms)
        cpu += float(c.cpu_ms.sum())
        rss = max(rss, int(c.peak_rss_kb.max()))
e = pd.concat(elapsed)
print(cells, failures, round(e.quantile(0.5), 3), round(e.quantile(0.95), 3), e.max(), round(cpu, 1), rss, sorted(errors.items()))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""

DUCKDB = r"""
import sys, resource, duckdb
src = f"read_json_auto('{sys.argv[1]}/*/*.jsonl', format='newline_delimited', union_by_name=true)"
row = duckdb.sql(f"select count(*), count(*) filter (where not success), quantile_disc(elapsed_ms, 0.5), quantile_disc(elapsed_ms, 0.95), max(elapsed_ms), round(sum(cpu_ms), 1), max(peak_rss_kb) from {src} where type = 'execution'").fetchall()[0]
errors = duckdb.sql(f"select error_type, count(*) from {src} where type = 'execution' and not success group by 1 order by 1").fetchall()
print(*row, errors)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def timed(cmd):
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate()
    return time.perf_counter() - t, out, err, p.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flowrepl", default=str(ROOT / "target/release/flowrepl"))
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true")
    opts = ap.parse_args()
    n = 100_000 if opts.quick else opts.records
    data = ROOT / "target" / "bench-logs" / str(n)
    t0 = time.perf_counter()
    generate(data, n)
    size = sum(f.stat().st_size for f in data.glob("*/*.jsonl"))
    print(f"\nflowrepl log stats over {n:,} records, {size / 1e9:.2f} GB in 10 files (generated/reused in {time.perf_counter() - t0:.1f} s)")
    py = sys.executable
    rows = {}
    # flowrepl: wait4 gives its own peak RSS.
    t = time.perf_counter()
    p = subprocess.Popen([opts.flowrepl, "log", "stats", "--json", "--log-dir", str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    rows["flowrepl log stats"] = (time.perf_counter() - t, usage.ru_maxrss)
    doc = json.loads(out)
    assert doc["cells"] > 0, doc
    for name, script in (("pandas", PANDAS), ("DuckDB", DUCKDB)):
        secs, out, err, code = timed([py, "-c", script, str(data)])
        assert code == 0, err
        rows[name] = (secs, int(err.strip().splitlines()[-1]))
        print(f"  {name}: {out.strip()[:160]}")
    print(f"  flowrepl: {doc['cells']} {doc['failures']} {doc['elapsed_ms']['p50']} {doc['elapsed_ms']['p95']} {doc['elapsed_ms']['max']} {doc['cpu_ms']['total']} {doc['peak_rss_kb_max']} {[(e['error_type'], e['count']) for e in doc['top_errors']]}")
    print(f"\n{'':<22} {'time (s)':>10} {'peak RSS (MB)':>14}")
    for name, (secs, rss) in rows.items():
        print(f"{name:<22} {secs:>10.2f} {rss / 1024:>14.1f}")
    ours = rows["flowrepl log stats"][0]
    for name, limit in (("pandas", 1.0), ("DuckDB", 2.0)):
        ratio = ours / rows[name][0]
        verdict = "PASS" if ratio <= limit else "MISS"
        print(f"  [{verdict}] flowrepl log stats / {name}: {ratio:.2f} <= {limit}")


if __name__ == "__main__":
    main()
