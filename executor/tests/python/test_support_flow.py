"""Unit tests of support/flow.py (`flow`: the task's context, events, steps)."""
import unittest

from helpers import support

F = support().flow


class ContextTest(unittest.TestCase):
    def test_update_merges_or_replaces_and_saves_the_whole_context(self):
        saved = []

        def save(new):
            saved.append(dict(new))
            return new

        ctx = F.Context({"a": 1}, save)
        self.assertEqual(ctx.update({"b": 2}), {"a": 1, "b": 2})
        self.assertEqual(ctx.update({"c": 3}, merge=False), {"c": 3})
        self.assertEqual(saved, [{"a": 1, "b": 2}, {"c": 3}])
        self.assertEqual(dict(ctx.items()), {"c": 3})
        self.assertIn("c", ctx)
        with self.assertRaises(TypeError):
            ctx.update([("x", 1)])


class StepTest(unittest.TestCase):
    def test_steps_nest_and_each_event_names_its_innermost_step(self):
        events = []
        clock = iter(range(100)).__next__
        identity = {"plan_id": "p", "task_id": "t"}
        flow = F.Flow(lambda name, data, step: events.append((name, step)), clock, lambda: 1, None, None, {}, identity)
        with flow.step("outer"):
            with flow.step("inner") as s:
                s.log("hello")
            flow.event("done")
        self.assertEqual(
            events,
            [
                ("step_start", None),
                ("step_start", "outer"),
                ("step_log", "inner"),
                ("step_end", "outer"),
                ("done", "outer"),
                ("step_end", None),
            ],
        )
        self.assertEqual((flow.plan_id, flow.task_id), ("p", "t"))


if __name__ == "__main__":
    unittest.main()
