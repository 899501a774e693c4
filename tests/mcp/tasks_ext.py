"""A client side of the MCP Tasks extension (SEP-2663, `io.modelcontextprotocol/tasks`) for
the official Python SDK, which ships the extension mechanism (ClientExtension, ResultClaim)
but no tasks client.

`Tasks()` in `Client(extensions=[...])` declares the extension (protocol 2026-07-28) and
resolves a `resultType: "task"` answer to `tools/call` by polling `tasks/get` until the task
ends: `completed` gives the tool result, `failed` and `cancelled` raise; `input_required`
sends each new input request to `on_input(request)` and its answer with `tasks/update`.
Every task seen and every status polled is recorded in `Tasks.seen` for the tests to check.
"""
from __future__ import annotations

from typing import Any, Literal

import anyio
import mcp_types as types
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from pydantic import BaseModel, ConfigDict, Field

TASKS = "io.modelcontextprotocol/tasks"


class TaskHandle(types.Result):
    """`CreateTaskResult`: the task's fields flattened beside `resultType: "task"`."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(default=None, alias="statusMessage")
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")
    ttl_ms: int | None = Field(default=None, alias="ttlMs")


class TaskIdParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class TasksGet(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class TasksCancel(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


class UpdateParams(types.RequestParams):
    task_id: str = Field(alias="taskId")
    input_responses: dict[str, Any] = Field(alias="inputResponses")


class TasksUpdate(types.Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams
    name_param = "taskId"


class TaskState(BaseModel):
    """`tasks/get`'s answer, as sent."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(default=None, alias="statusMessage")
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = Field(default=None, alias="inputRequests")


class TaskEnded(RuntimeError):
    """The task ended `failed` or `cancelled`."""

    def __init__(self, state: TaskState):
        super().__init__(f"task {state.task_id} ended {state.status}: {state.error}")
        self.state = state


async def get(session, task_id: str) -> TaskState:
    return await session.send_request(TasksGet(params=TaskIdParams(taskId=task_id)), TaskState)


async def cancel(session, task_id: str) -> None:
    await session.send_request(TasksCancel(params=TaskIdParams(taskId=task_id)), types.EmptyResult)


class Tasks(ClientExtension):
    identifier = TASKS

    def __init__(self, poll_s: float | None = None, on_task=None, on_input=None):
        self.poll_s = poll_s
        self.on_task = on_task
        self.on_input = on_input
        self.seen: list[dict[str, Any]] = []

    def claims(self):
        return (ResultClaim(result_type="task", model=TaskHandle, resolve=self._resolve),)

    async def _resolve(self, handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
        entry = {"task": handle.task_id, "tool": ctx.tool_name, "first": handle.status,
                 "message": handle.status_message, "polls": []}
        self.seen.append(entry)
        if self.on_task is not None:
            await self.on_task(ctx.session, handle)
        pause = self.poll_s if self.poll_s is not None else (handle.poll_interval_ms or 1000) / 1000
        while True:
            state = await get(ctx.session, handle.task_id)
            entry["polls"].append(state.status)
            entry.setdefault("messages", []).append(state.status_message)
            if state.status == "completed":
                return types.CallToolResult.model_validate(state.result)
            if state.status in ("failed", "cancelled"):
                raise TaskEnded(state)
            if state.status == "input_required" and self.on_input is not None:
                answers = {}
                for key, request in (state.input_requests or {}).items():
                    if key not in entry.setdefault("answered", []):
                        entry["answered"].append(key)
                        answers[key] = await self.on_input(request)
                if answers:
                    params = UpdateParams(taskId=handle.task_id, inputResponses=answers)
                    await ctx.session.send_request(TasksUpdate(params=params), types.EmptyResult)
                    continue
            await anyio.sleep(pause)
