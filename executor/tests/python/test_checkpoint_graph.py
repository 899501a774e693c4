"""Unit tests of checkpoint/graph.py (which names are pickled together, load order)."""
import unittest

from helpers import checkpoint

G = checkpoint().graph


class GraphTest(unittest.TestCase):
    def test_cycles_are_found_without_recursion(self):
        edges = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}
        found = G.cycles(["d"], lambda n: edges.get(n, ()))
        self.assertEqual([sorted(c) for c in found], [["a", "b", "c"]])
        # A long chain does not reach Python's recursion limit.
        chain = {i: [i + 1] for i in range(100_000)}
        self.assertEqual(G.cycles([0], lambda n: chain.get(n, ())), [])

    def test_names_that_share_or_refer_in_a_circle_are_one_group(self):
        pickled = {
            "a": (b"", (), {1: object()}),
            "b": (b"", (), {1: object()}),
            "c": (b"", ("d",), {}),
            "d": (b"", ("c",), {}),
            "e": (b"", ("a",), {}),
        }
        self.assertEqual(sorted(G.groups(pickled)), [["a", "b"], ["c", "d"], ["e"]])

    def test_groups_load_after_what_they_refer_to(self):
        groups = [{"names": ["x"], "refs": ["y"]}, {"names": ["y"], "refs": []}]
        self.assertEqual(G.load_order(groups, {"x": 0, "y": 1}), [1, 0])


if __name__ == "__main__":
    unittest.main()
