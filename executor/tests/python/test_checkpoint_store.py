"""Unit tests of checkpoint/store.py (`Store`: the automatic checkpoint; named checkpoints)."""
import json
import os
import tempfile
import unittest

from helpers import checkpoint

C = checkpoint()
S = C.store


def journal(directory):
    with open(os.path.join(directory, C.files.JOURNAL)) as f:
        return [json.loads(line) for line in f]


class SaveNamedTest(unittest.TestCase):
    def test_values_functions_and_what_cannot_be_saved(self):
        ns = {}
        exec("import os\nx = [1, 2]\ndef double(v):\n    return 2 * v\ng = (i for i in x)\n", ns)
        with tempfile.TemporaryDirectory() as d:
            target = os.path.join(d, "checkpoints", "first")
            summary = S.save_named(ns, target, 1 << 30, 0, 5, '{"k": 1}', "sess")
            lines = journal(target)
        self.assertEqual(summary["checkpoint"], "first")
        self.assertEqual(summary["execution_count"], 5)
        self.assertIn("x", summary["saved"])
        self.assertIn("double", summary["saved"])
        self.assertIn("g", summary["unsaved"])
        self.assertEqual(len(lines), 1)
        self.assertTrue(lines[0]["full"])
        self.assertEqual(lines[0]["modules"], {"os": "os"})
        self.assertEqual(lines[0]["session"], "sess")


class StoreTest(unittest.TestCase):
    def test_an_incremental_checkpoint_saves_only_what_changed(self):
        ns = {"a": [1], "b": [2]}
        with tempfile.TemporaryDirectory() as d:
            store = S.Store(ns, os.path.join(d, "auto"), 1 << 30, 1 << 20)
            first = store.checkpoint([], False, 1, None)
            self.assertTrue(first["full"])
            ns["b"] = [3]
            ns["c"] = ns["a"]
            second = store.checkpoint([], False, 2, None)
            self.assertFalse(second["full"])
            # The rebound name and the new one; `a`, unchanged, is not saved again (`c` refers to it).
            self.assertEqual(second["saved"], ["b", "c"])
            del ns["a"]
            third = store.checkpoint([], False, 3, None)
            self.assertEqual(third["dropped"], ["a"])
            self.assertEqual(len(journal(store.dir)), 3)

    def test_compaction_rewrites_the_journal_as_one_full_line(self):
        ns = {"a": 0}
        with tempfile.TemporaryDirectory() as d:
            store = S.Store(ns, os.path.join(d, "auto"), 1 << 30, 1 << 20)
            for i in range(S.MAX_LINES + 1):
                ns["a"] = [i]
                store.checkpoint([], False, i, None)
            lines = journal(store.dir)
            self.assertLess(len(lines), S.MAX_LINES)
            self.assertTrue(lines[0]["full"])
            self.assertLessEqual(len(C.files.segment_bytes(store.dir)), 2)

    def test_a_store_restored_from_its_own_folder_continues_incrementally(self):
        ns = {"a": [1], "b": {"k": 2}}
        with tempfile.TemporaryDirectory() as d:
            store = S.Store(ns, os.path.join(d, "auto"), 1 << 30, 1 << 20)
            store.checkpoint([], False, 1, None)
            line = journal(store.dir)[0]
            state = {"python": line["python"], "modules": {}, "unsaved": {}, "groups": line["put"]}
            fresh = {}
            again = S.Store(fresh, store.dir, 1 << 30, 1 << 20)
            restored, lost = again.restore(state, store.dir)
            self.assertEqual(restored, ["a", "b"])
            self.assertEqual(lost, {})
            fresh["c"] = 3
            # The next checkpoint compacts (the journal was folded) and keeps every name.
            summary = again.checkpoint([], False, 2, None)
            self.assertIn("c", summary["saved"])


if __name__ == "__main__":
    unittest.main()
