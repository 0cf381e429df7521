"""The requester side of the Tasks extension (SEP-2663) on the mcp 2.x client's extension API: a tools/call that
answers ``resultType: "task"`` is resolved by polling ``tasks/get`` until the task ends. What it saw is kept for
the test to look at."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import anyio
import mcp_types as types
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from pydantic import ConfigDict

TASKS = "io.modelcontextprotocol/tasks"
TERMINAL = ("completed", "failed", "cancelled")


class TaskCreated(types.Result):
    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None


class TaskState(types.Result):
    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskParams(types.RequestParams):
    task_id: str


class GetTask(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param: ClassVar[str | None] = "taskId"


class CancelTask(types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param: ClassVar[str | None] = "taskId"


@dataclass
class TasksClient(ClientExtension):
    """Declares the extension on every request and resolves the tasks the server makes; ``cancel_after_polls``
    sends ``tasks/cancel`` after that many polls instead of waiting for the end."""

    identifier: ClassVar[str] = TASKS
    cancel_after_polls: int | None = None
    created: list[TaskCreated] = field(default_factory=list)
    polls: list[TaskState] = field(default_factory=list)

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskCreated, resolve=self._resolve)]

    async def _resolve(self, created: TaskCreated, ctx: ClaimContext) -> types.CallToolResult:
        self.created.append(created)
        params = TaskParams(task_id=created.task_id)
        while True:
            state = await ctx.session.send_request(GetTask(params=params), TaskState)
            self.polls.append(state)
            if state.status in TERMINAL:
                break
            if self.cancel_after_polls is not None and len(self.polls) >= self.cancel_after_polls:
                await ctx.session.send_request(CancelTask(params=params), types.EmptyResult)
            await anyio.sleep((created.poll_interval_ms or 1000) / 1000)
        if state.result is None:
            return types.CallToolResult(content=[], is_error=True, structured_content={"task": state.status})
        return types.CallToolResult.model_validate(state.result)
