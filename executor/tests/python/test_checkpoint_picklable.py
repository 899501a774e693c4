"""Unit tests of checkpoint/picklable.py (what can be saved, references between names)."""
import io
import threading
import unittest

from helpers import checkpoint

P = checkpoint().picklable


class PicklableTest(unittest.TestCase):
    def test_what_cannot_be_saved_is_named_before_trying(self):
        self.assertIn("generator", P.why_not(i for i in ()))
        self.assertIn("thread synchronisation", P.why_not(threading.Lock()))
        self.assertIsNone(P.why_not([1, 2]))
        self.assertFalse(P.identity_matters((1, 2)))
        self.assertTrue(P.identity_matters([1, 2]))

    def test_names_reached_through_the_sessions_functions(self):
        ns = {}
        exec("a = 1\nb = 2\ndef f():\n    return b\n", ns)
        codes = [compile("f()\n", "<cell>", "exec")]
        self.assertEqual(P.touched(ns, codes), {"f", "b"})

    def test_globals_or_exec_means_every_name(self):
        self.assertIsNone(P.touched({}, [compile("globals()['x'] = 1", "<cell>", "exec")]))

    def test_another_names_value_is_a_reference_and_comes_back_shared(self):
        ns = {"a": [1], "b": None}
        ns["b"] = {"inner": ns["a"]}
        cls, _, by_value = P.pickler()
        self.assertTrue(by_value)
        out = io.BytesIO()
        used, _ = P.dump(P.pickler_class(cls, ns), {"b": ns["b"]}, {id(ns["a"]): "a"}, out)
        self.assertEqual(used, {"a"})
        back = P.unpickler(ns, ns.__getitem__)(out.getvalue())
        self.assertIs(back["b"]["inner"], ns["a"])

    def test_a_session_function_sees_the_live_namespace(self):
        ns = {}
        exec("k = 2\ndef f():\n    return k\n", ns)
        cls, _, _ = P.pickler()
        out = io.BytesIO()
        P.dump(P.pickler_class(cls, ns), {"f": ns["f"]}, {}, out)
        back = P.unpickler(ns, ns.__getitem__)(out.getvalue())["f"]
        ns["k"] = 3
        self.assertEqual(back(), 3)


if __name__ == "__main__":
    unittest.main()
