"""Unit tests of checkpoint/restore.py (loading a folded checkpoint)."""
import os
import tempfile
import unittest

from helpers import checkpoint

C = checkpoint()


def folded(directory):
    """The journal folded as the Rust reader does, for a directory of one full line."""
    import json

    with open(os.path.join(directory, C.files.JOURNAL)) as f:
        line = json.loads(f.readline())
    return {
        "python": line["python"],
        "modules": line["modules"],
        "unsaved": line["unsaved"],
        "groups": line["put"],
        "context": line["context"],
    }


class RestoreTest(unittest.TestCase):
    def test_names_come_back_shared_and_the_lost_are_named(self):
        ns = {}
        exec("import os\nx = [1, 2]\ny = {'x': x}\ng = (i for i in x)\n", ns)
        with tempfile.TemporaryDirectory() as d:
            target = os.path.join(d, "cp")
            C.store.save_named(ns, target, 1 << 30, 0, 1, None)
            state = folded(target)
            fresh = {}
            restored, lost, groups = C.restore.load(fresh, state, target)
        self.assertEqual(sorted(restored), ["os", "x", "y"])
        self.assertIs(fresh["y"]["x"], fresh["x"])
        self.assertIn("generator", lost["g"])
        self.assertTrue(groups)

    def test_another_pythons_checkpoint_is_lost_whole(self):
        state = {"python": "2.7", "modules": {"os": "os"}, "unsaved": {}, "groups": [{"names": ["x"]}]}
        restored, lost, groups = C.restore.load({}, state, "/nonexistent")
        self.assertEqual(restored, [])
        self.assertEqual(sorted(lost), ["os", "x"])
        self.assertIsNone(groups)

    def test_a_short_segment_loses_only_its_names(self):
        ns = {"a": [1], "b": [2]}
        with tempfile.TemporaryDirectory() as d:
            target = os.path.join(d, "cp")
            C.store.save_named(ns, target, 1 << 30, 0, 1, None)
            state = folded(target)
            state["groups"].append({"names": ["c"], "seg": state["groups"][0]["seg"], "off": 1 << 20, "len": 5, "refs": []})
            restored, lost, _ = C.restore.load({}, state, target)
        self.assertEqual(sorted(restored), ["a", "b"])
        self.assertIn("shorter than the journal says", lost["c"])


if __name__ == "__main__":
    unittest.main()
