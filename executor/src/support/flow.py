"""`flow` in every cell: the module `_flowrepl_flow` (part of the support package, loaded
when the executor starts; see executor/src/support.rs, `SUPPORT`). The task's identity and
context, events and steps, and requests for approval; the Rust side gives it the functions
that emit, save and ask (executor/src/flow.rs). Unit tests: executor/tests/python/test_support_flow.py.
"""
import sys


class ApprovalCancelled(Exception):
    """A request for approval was dismissed, timed out, or its channel failed."""


class _Step:
    """`with flow.step(name, **data) as s:`: step_start and step_end events around the block
    (step_end says how long it took and whether it raised; the exception goes on)."""

    def __init__(self, flow, name, data):
        self._flow, self.name, self._data = flow, name, data

    def __enter__(self):
        self._flow._report("step_start", {"name": self.name, **self._data})
        self._flow._steps.append(self.name)
        self._t0 = self._flow._clock()
        return self

    def log(self, message):
        """A step_log event inside this step."""
        self._flow._report("step_log", {"name": self.name, "message": str(message)})

    def __exit__(self, kind, exc, tb):
        ms = round((self._flow._clock() - self._t0) * 1000.0, 3)
        steps = self._flow._steps
        if steps and steps[-1] == self.name:
            steps.pop()
        self._flow._report(
            "step_end",
            {
                "name": self.name,
                "duration_ms": ms,
                "success": kind is None,
                "error": None if kind is None else kind.__name__,
            },
        )
        return False


class Context:
    """The task's context: a JSON object that outlives the kernel (every kernel started
    later for the same plan and task starts from it). Read it like a mapping; change it only
    with `update`, which saves the whole new context to the task log."""

    def __init__(self, data, save):
        self._data = data
        self._save = save

    def __getitem__(self, key):
        return self._data[key]

    def get(self, key, default=None):
        return self._data.get(key, default)

    def __contains__(self, key):
        return key in self._data

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)

    def keys(self):
        return self._data.keys()

    def values(self):
        return self._data.values()

    def items(self):
        return self._data.items()

    def __eq__(self, other):
        return dict(self._data) == (dict(other) if isinstance(other, Context) else other)

    def __repr__(self):
        return f"flow.context({self._data!r})"

    def update(self, data, merge=True):
        """Merges `data` (a dict of JSON values) into the context, or with `merge=False`
        replaces it; returns the new context as a dict. Anything not JSON raises TypeError
        naming the key, and nothing is saved."""
        if not isinstance(data, dict):
            if isinstance(data, Context):
                data = dict(data._data)
            else:
                raise TypeError("flow.context.update takes a dict")
        new = {**self._data, **data} if merge else dict(data)
        self._data = self._save(new)
        return dict(self._data)


class Flow:
    """The task this session belongs to, and a way to report what the cell is doing.
    Available in every cell as `flow` (also `flowrepl.flow`); not a session variable."""

    ApprovalCancelled = ApprovalCancelled

    def __init__(self, emit, clock, count, save_context, approve, context, identity):
        self._emit = emit
        self._approve = approve
        self.last_approval = None
        self._clock = clock
        self._count = count
        self.context = Context(context, save_context)
        self._steps = []
        self.plan_id = identity.get("plan_id")
        self.task_id = identity.get("task_id")
        self.task_name = identity.get("task_name")
        self.session_id = identity.get("session_id")

    @property
    def execution_count(self):
        """The running cell's `execution_count`."""
        return self._count()

    def __repr__(self):
        return f"<flow plan={self.plan_id!r} task={self.task_id!r} cell={self.execution_count}>"

    def event(self, name, /, **data):
        """Reports a structured event: a name and JSON-serialisable keyword data
        (anything else raises TypeError naming the key)."""
        if not isinstance(name, str) or not name:
            raise TypeError("flow.event: the name must be a non-empty string")
        self._report(name, data)

    def step(self, name, /, **data):
        """A context manager: step_start and step_end events around the block; `s.log(msg)`
        inside it adds a step_log event. Steps nest: each event names its innermost step."""
        if not isinstance(name, str) or not name:
            raise TypeError("flow.step: the name must be a non-empty string")
        return _Step(self, name, data)

    def request_approval(self, message, /, timeout_s=None, **data):
        """Asks a person and waits for the answer: True (approved), False (declined), None
        (nobody can be asked: no channel), or raises flow.ApprovalCancelled (dismissed, or
        no answer within `timeout_s` seconds). The wait does not count against the cell's
        timeout; interrupting the cell ends it with KeyboardInterrupt. `flow.last_approval`
        then holds the outcome and the person's comment."""
        if not isinstance(message, str) or not message:
            raise TypeError("flow.request_approval: the message must be a non-empty string")
        if timeout_s is not None:
            if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                    or not timeout_s > 0 or timeout_s != timeout_s:
                raise ValueError("flow.request_approval: timeout_s must be a positive number of seconds or None")
            timeout_s = float(timeout_s)
        self._flush()
        outcome, text = self._approve(message, data, timeout_s, self._steps[-1] if self._steps else None)
        self.last_approval = {"outcome": outcome, "comment": text if outcome in ("approved", "declined") else None,
                              "reason": None if outcome in ("approved", "declined") else text}
        if outcome == "approved":
            return True
        if outcome == "declined":
            return False
        if outcome == "unavailable":
            return None
        raise ApprovalCancelled(text or "the request for approval was cancelled")

    def _flush(self):
        out = sys.stdout
        if out is not None:
            try:
                out.flush()  # so that the event is placed after what was printed before it
            except Exception:
                pass

    def _report(self, name, data):
        self._flush()
        self._emit(name, data, self._steps[-1] if self._steps else None)


def install_flow(emit, clock, count, save_context, approve, context, identity):
    """`flow` for every cell: a builtin (so not a session variable, and a cell that rebinds
    the name only shadows it) and `flowrepl.flow`."""
    import builtins
    import types

    flow = Flow(emit, clock, count, save_context, approve, context, identity)
    builtins.flow = flow
    module = types.ModuleType("flowrepl", "flowrepl's own objects for cells: flowrepl.flow")
    module.flow = flow
    module.ApprovalCancelled = ApprovalCancelled
    sys.modules["flowrepl"] = module
    return flow
