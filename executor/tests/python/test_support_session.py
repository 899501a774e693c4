"""Unit tests of support/session.py (stdio, startup files, the namespace's reset)."""
import io
import os
import sys
import tempfile
import unittest

from helpers import support

S = support().session


class NoStdinTest(unittest.TestCase):
    def test_reads_are_at_eof_and_say_why_on_stderr(self):
        err = io.StringIO()
        old, sys.stderr = sys.stderr, err
        try:
            stdin = S.NoStdin()
            self.assertEqual(stdin.readline(), "")
            self.assertEqual(stdin.read(), "")
        finally:
            sys.stderr = old
        self.assertIn("input()/sys.stdin.readline() reached EOF", err.getvalue())
        self.assertIn("sys.stdin.read() reached EOF", err.getvalue())


class NamespaceTest(unittest.TestCase):
    def test_reset_keeps_only_what_a_fresh_main_has(self):
        ns = {"__name__": "__main__", "__builtins__": __builtins__, "x": 1, "_y": 2}
        S.reset_namespace(ns)
        self.assertEqual(sorted(ns), ["__annotations__", "__builtins__", "__name__"])

    def test_a_failing_startup_file_is_reported_and_the_next_still_runs(self):
        with tempfile.TemporaryDirectory() as d:
            bad, good = os.path.join(d, "bad.py"), os.path.join(d, "good.py")
            with open(bad, "w") as f:
                f.write("raise ValueError('boom')\n")
            with open(good, "w") as f:
                f.write("ready = True\n")
            ns = {}
            errors = S.run_startup(ns, [bad, good])
        self.assertTrue(ns["ready"])
        self.assertEqual(len(errors), 1)
        self.assertIn("bad.py failed", errors[0])
        self.assertIn("ValueError: boom", errors[0])

if __name__ == "__main__":
    unittest.main()
