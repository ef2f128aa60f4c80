"""Persistent chats over one `@agent`.

Each send is an ordinary standalone durable agent run seeded with
the chat's history plus the new user message; the agent body is not called.
The `chats` row is written by the core after every completed send.
"""

from __future__ import annotations

import time
from _thread import allocate_lock

from . import _codec, _engine
from .errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._interrupt import Interrupt
    from ._streams import RunStream
    from .agentfn import AgentFunction
    from .events import Event
    from .messages import Message
    from .runs import Budget, Run

__all__ = ["Chat", "ChatStream", "chat", "load_chat"]


class Chat:
    """A conversation with one agent. Made by `chat()` or `load_chat()`,
    not constructed directly.

    `system`, `model` and `created_at` are what the chat stores and
    `load_chat` restores.
    """

    def __init__(
        self,
        agent_fn: AgentFunction,
        *,
        chat_id: str,
        messages: list[Message],
        system: str | None,
        model: Any,
        approver: Any,
        tool_interceptor: Any,
        context_manager: Any,
        created_at: float,
    ) -> None:
        self.id = chat_id
        self._agent = agent_fn
        self._messages = list(messages)
        self.system = system
        self.model = model
        self._approver = approver
        self._interceptor = tool_interceptor
        self._context_manager = context_manager
        self.created_at = created_at
        self._pending: Interrupt | None = None
        self._last_run_id: str | None = None
        self._lock = allocate_lock()

    def __repr__(self) -> str:
        return f"<Chat {self.id!r} agent={self._agent.name!r} messages={len(self._messages)}>"

    @property
    def messages(self) -> list[Message]:
        """A copy of the history (no system prompt)."""
        return list(self._messages)

    @property
    def pending(self) -> Interrupt | None:
        """The interrupt of the last send if it paused, else `None`."""
        return self._pending

    def _opts(self, budget: Any) -> dict:
        from .agentfn import _overrides

        return _overrides(
            budget,
            self.system,
            self.model,
            self._approver,
            self._interceptor,
            self._context_manager,
        )

    def _run_send(self, text: str, budget: Any) -> Run:
        from ._agent_runs import run_seeded
        from .messages import Message

        seed = [*self._messages, Message.user(text)]
        return run_seeded(self._agent, seed, self._opts(budget))

    def send(self, text: str, *, budget: Budget | None = None) -> Run:
        """Run the agent on `history + [Message.user(text)]` as a standalone
        durable run, then fold the outcome into the chat."""
        return self._fold(self._run_send(text, budget))

    def resume(self, answers: dict[str, Any] | None = None, *, budget: Budget | None = None) -> Run:
        """Resume the last paused send with this chat's own callbacks."""
        if self._pending is None or self._last_run_id is None:
            raise ConfigError("nothing to resume: this chat has no paused send")
        from .flow import resume

        run = resume(
            self._last_run_id,
            answers,
            budget=budget,
            approver=self._approver,
            tool_interceptor=self._interceptor,
            context_manager=self._context_manager,
        )
        return self._fold(run)

    def stream(self, text: str, *, budget: Budget | None = None) -> ChatStream:
        """`send` on a background thread, as a cancellable event stream."""
        from ._streams import RunStream

        stream = RunStream.start(lambda: self._run_send(text, budget), cancellable=True)
        return ChatStream(self, stream)

    def _fold(self, run: Run) -> Run:
        """Remember the run; a completed run replaces the history and
        is persisted, a paused one sets `pending`."""
        with self._lock:
            self._last_run_id = run.id
            if run.status == "completed":
                self._messages = list(run.messages)
                self._pending = None
                model = self.model if isinstance(self.model, str) else None
                _engine.get_store().save_chat(
                    self.id,
                    self._agent.name,
                    self.system,
                    model,
                    _codec.dumps(self._messages),
                    self.created_at,
                )
            elif run.status == "paused":
                self._pending = run.pending
            else:
                self._pending = None
        return run


class ChatStream:
    """Events of one chat send. The outcome is folded into the chat
    once: when iteration finishes or when `run` is read."""

    def __init__(self, chat_obj: Chat, stream: RunStream) -> None:
        self._chat = chat_obj
        self._stream = stream
        self._closed = False
        self._folded = False
        self._lock = allocate_lock()

    def __iter__(self) -> ChatStream:
        return self

    def __next__(self) -> Event:
        try:
            return next(self._stream)
        except StopIteration:
            if not self._closed:  # the run settled: its outcome is ready
                self._fold_outcome()
            raise

    def _fold_outcome(self) -> Run:
        run = self._stream.run  # re-raises a failure; nothing is folded then
        with self._lock:
            first, self._folded = not self._folded, True
        if first:
            self._chat._fold(run)
        return run

    @property
    def run(self) -> Run:
        """Wait for the send; return its `Run` (folding it in) or re-raise."""
        return self._fold_outcome()

    def close(self) -> None:
        """Stop receiving events (idempotent); the send continues."""
        self._closed = True
        self._stream.close()

    def cancel(self) -> None:
        """Stop the send at its next check."""
        self._stream.cancel()


def _check_agent(agent_fn: Any) -> AgentFunction:
    from .agentfn import AgentFunction

    if not isinstance(agent_fn, AgentFunction):
        raise ConfigError(f"chat() requires an @agent function, got {type(agent_fn)!r}")
    return agent_fn


def chat(
    agent_fn: AgentFunction,
    *,
    system: str | None = None,
    model: Any = None,
    approver: Any = None,
    tool_interceptor: Any = None,
    context_manager: Any = None,
) -> Chat:
    """A new chat with a fresh id and empty history; nothing is stored until
    the first completed send."""
    from . import _core

    return Chat(
        _check_agent(agent_fn),
        chat_id=_core.ulid(),
        messages=[],
        system=system,
        model=model,
        approver=approver,
        tool_interceptor=tool_interceptor,
        context_manager=context_manager,
        created_at=time.time(),
    )


def load_chat(chat_id: str) -> Chat:
    """Restore a chat saved by any process. Callbacks are not
    persisted: a loaded chat has none."""
    row = _engine.get_store().load_chat(chat_id)
    if row is None:
        raise ConfigError(f"no chat found with chat_id '{chat_id}'")
    from .agentfn import _AGENTS

    agent_name = row["agent_name"]
    agent_fn = _AGENTS.get(agent_name)
    if agent_fn is None:
        raise ConfigError(
            f"chat '{chat_id}' belongs to agent '{agent_name}', which is not registered in this "
            "process -- import the module that defines it first"
        )
    return Chat(
        agent_fn,
        chat_id=row["chat_id"],
        messages=list(_codec.loads(row["messages_json"])),
        system=row["system"],
        model=row["model"],
        approver=None,
        tool_interceptor=None,
        context_manager=None,
        created_at=row["created_at"],
    )
