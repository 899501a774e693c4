"""Unit tests of snapshot.py (the module `_flowrepl_snapshot`: checkpoints), in a plain
interpreter of each version, with the vendored cloudpickle as the kernel loads it."""
import json
import os
import tempfile
import unittest

from helpers import snapshot

S = snapshot()


class JournalLineTest(unittest.TestCase):
    def test_one_line_with_every_field(self):
        group = S._Group(["a"], "s1.pkl", 0, 10, {"b"}, None)
        text = S.journal_line(True, 3, "pickle", "sess", [group], {"np": "numpy"}, {}, [], None)
        self.assertTrue(text.endswith("\n"))
        self.assertEqual(text.count("\n"), 1)
        line = json.loads(text)
        self.assertEqual(line["v"], S.FORMAT)
        self.assertEqual(line["put"], [{"names": ["a"], "seg": "s1.pkl", "off": 0, "len": 10, "refs": ["b"]}])
        self.assertNotIn("ms", line)
        self.assertIn("ms", json.loads(S.journal_line(False, 3, "p", None, [], {}, {}, [], None, 2.0)))


class TouchedTest(unittest.TestCase):
    def test_names_reached_through_the_sessions_functions(self):
        ns = {}
        exec("a = 1\nb = 2\ndef f():\n    return b\n", ns)
        codes = [compile("f()\n", "<cell>", "exec")]
        self.assertEqual(S.touched(ns, codes), {"f", "b"})

    def test_globals_or_exec_means_every_name(self):
        self.assertIsNone(S.touched({}, [compile("globals()['x'] = 1", "<cell>", "exec")]))


class SaveNamedTest(unittest.TestCase):
    def test_values_functions_and_what_cannot_be_saved(self):
        ns = {}
        exec("import os\nx = [1, 2]\ndef double(v):\n    return 2 * v\ng = (i for i in x)\n", ns)
        with tempfile.TemporaryDirectory() as d:
            target = os.path.join(d, "checkpoints", "first")
            summary = S.save_named(ns, target, 1 << 30, 0, 5, '{"k": 1}', "sess")
            with open(os.path.join(target, S.JOURNAL)) as f:
                lines = [json.loads(line) for line in f]
        self.assertEqual(summary["checkpoint"], "first")
        self.assertEqual(summary["execution_count"], 5)
        self.assertIn("x", summary["saved"])
        self.assertIn("double", summary["saved"])
        self.assertIn("g", summary["unsaved"])
        self.assertEqual(len(lines), 1)
        self.assertTrue(lines[0]["full"])
        self.assertEqual(lines[0]["modules"], {"os": "os"})
        self.assertEqual(lines[0]["session"], "sess")


if __name__ == "__main__":
    unittest.main()
