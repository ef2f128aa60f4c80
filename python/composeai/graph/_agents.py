"""Agent nodes of a graph: the conversation comes from and goes
back to `state["messages"]`; an approval-gated tool pause suspends the graph.
"""

from __future__ import annotations

from typing import Any

from .. import _codec, _engine
from .._engine import FRAME
from ..errors import ConfigError
from ._values import suspend


def run_agent_node(agent: Any, state: dict, resume: Any, list_reducer: bool) -> Any:
    from ..agentfn import run_conversation_step
    from ..messages import Message

    conversation = state.get("messages")
    if isinstance(conversation, str):
        messages = [Message.user(conversation)]
    elif isinstance(conversation, list) and all(isinstance(m, Message) for m in conversation):
        messages = list(conversation)
    else:
        raise ConfigError(
            f"agent node {agent.name!r} reads state['messages']: a list[Message] or a str, got "
            f"{type(conversation).__name__}"
        )
    frame = FRAME.get()
    # An agent node runs as a step of its graph's run.
    assert frame is not None and frame.run is not None
    attempt = frame.run.attempt
    if isinstance(resume, dict) and resume:
        # The answers for the tool calls the agent paused on, keyed by
        # interrupt id, where the agent's interrupt lookups find them.
        attempt.record_answers([(str(k), _codec.dumps(v)) for k, v in resume.items()])
    try:
        _, transcript = run_conversation_step(agent, messages)
    except _engine._Pause as pause:
        for snapshot in pause.snapshots:
            attempt.save_agent_state(snapshot, frame.fence)
        requests = [p.interrupt().model_dump(mode="json") for p in (pause, *pause.others)]
        return suspend({"kind": "agent_approval", "requests": requests})
    # The transcript is the whole conversation: under a list reducer it
    # replaces the list instead of being appended to it.
    return {"messages": {"$replace": transcript} if list_reducer else transcript}
