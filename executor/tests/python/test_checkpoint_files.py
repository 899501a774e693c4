"""Unit tests of checkpoint/files.py (segment files and journal lines)."""
import json
import os
import tempfile
import unittest

from helpers import checkpoint

F = checkpoint().files


class JournalLineTest(unittest.TestCase):
    def test_one_line_with_every_field(self):
        group = F.Group(["a"], "s1.pkl", 0, 10, {"b"}, None)
        text = F.journal_line(True, 3, "pickle", "sess", [group], {"np": "numpy"}, {}, [], None)
        self.assertTrue(text.endswith("\n"))
        self.assertEqual(text.count("\n"), 1)
        line = json.loads(text)
        self.assertEqual(line["v"], F.FORMAT)
        self.assertEqual(line["put"], [{"names": ["a"], "seg": "s1.pkl", "off": 0, "len": 10, "refs": ["b"]}])
        self.assertNotIn("ms", line)
        self.assertIn("ms", json.loads(F.journal_line(False, 3, "p", None, [], {}, {}, [], None, 2.0)))


class FilesTest(unittest.TestCase):
    def test_append_and_replace_leave_whole_lines(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, F.JOURNAL)
            F.append(path, "one\n")
            F.append(path, "two\n")
            with open(path) as f:
                self.assertEqual(f.read(), "one\ntwo\n")
            F.replace(path, "all\n")
            with open(path) as f:
                self.assertEqual(f.read(), "all\n")
            self.assertEqual(os.listdir(d), [F.JOURNAL])

    def test_segments_are_numbered_and_collected(self):
        with tempfile.TemporaryDirectory() as d:
            for seq in (1, 7):
                with open(os.path.join(d, F.segment_name(seq)), "wb") as f:
                    f.write(b"x" * seq)
            open(os.path.join(d, "journal.jsonl.9.tmp"), "w").close()
            sizes = F.segment_bytes(d)
            self.assertEqual(sizes, {"s-000001.bin": 1, "s-000007.bin": 7})
            self.assertEqual(F.last_segment(sizes), 7)
            F.collect(d, {"s-000007.bin"})
            self.assertEqual(os.listdir(d), ["s-000007.bin"])


if __name__ == "__main__":
    unittest.main()
