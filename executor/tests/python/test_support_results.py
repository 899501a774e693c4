"""Unit tests of support/results.py (exceptions, figures, variables)."""
import base64
import json
import linecache
import struct
import unittest
import zlib

from helpers import support

P = support()
S = P.results


def png(width, height):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


class Shows:
    def __init__(self, data):
        self.data = data

    def _repr_png_(self):
        return self.data


class ExceptionTest(unittest.TestCase):
    def test_type_message_and_the_cells_lines_in_the_traceback(self):
        P.session.register_sources([("<cell-1>", "x = 1\n1 / 0\n")])
        self.assertEqual(linecache.getline("<cell-1>", 2), "1 / 0\n")
        try:
            exec(compile("x = 1\n1 / 0\n", "<cell-1>", "exec"), {})
        except ZeroDivisionError as e:
            kind, message, text = S.format_exception(e)
        self.assertEqual(kind, "ZeroDivisionError")
        self.assertEqual(message, "division by zero")
        self.assertIn('File "<cell-1>", line 2', text)
        self.assertIn("1 / 0", text)

    def test_an_exception_whose_str_raises_is_still_described(self):
        class Bad(Exception):
            def __str__(self):
                raise RuntimeError("no")

            def __repr__(self):
                raise RuntimeError("no")

        kind, message, _ = S.format_exception(Bad())
        self.assertEqual((kind, message), ("Bad", "<unprintable Bad>"))


class VariablesTest(unittest.TestCase):
    def test_variables_are_listed_without_dunders_with_sizes_and_short_reprs(self):
        ns = {"__name__": "__main__", "items": [1, 2, 3], "text": "x" * 500, "f": len}
        listed = {v["name"]: v for v in json.loads(S.list_variables(ns, max_repr=40))}
        self.assertEqual(sorted(listed), ["f", "items", "text"])
        self.assertEqual(listed["items"]["len"], 3)
        self.assertEqual(listed["items"]["type"], "list")
        self.assertLessEqual(len(listed["text"]["repr"]), 40)
        self.assertIn("...", listed["text"]["repr"])


class ImagesTest(unittest.TestCase):
    def test_a_png_result_is_returned_and_other_data_is_named(self):
        data = png(3, 2)
        images, notes = S.collect_images(Shows(data), 4, 100)
        self.assertEqual(notes, [])
        self.assertEqual(images, [("result", base64.b64encode(data).decode(), 3, 2, len(data))])
        images, notes = S.collect_images(Shows(b"GIF89a...."), 4, 100)
        self.assertEqual(images, [])
        self.assertIn("not a PNG image", notes[0])
        images, notes = S.collect_images(Shows(png(20, 20)), 4, 100)
        self.assertEqual(images, [])
        self.assertIn("over the limit of 100", notes[0])

if __name__ == "__main__":
    unittest.main()
