"""`@agent`: LLM loops as typed functions.

The loop is written once, as a generator that yields its I/O (model calls,
tool batches, user callbacks) to a driver; the sync driver performs them on
the calling thread, the async driver awaits them on the caller's loop. So
both surfaces run the same logic.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from . import _codec, _core, _drive, _engine
from ._agent_call import (
    _Call,
    _output_schema,
    _overrides,
    _pop_budget,
    _push_budget,
    _signature_types,
)
from ._agent_drive import _agent_loop_async, _agent_loop_sync, _drive_sync, _restore
from ._agent_loop import _loop
from ._agent_runs import (
    _AGENTS,
    _plain_standalone,
    _standalone_async,
    _standalone_plain,
    _standalone_sync,
)
from ._engine import FRAME, Frame
from .errors import (
    ConfigError,
)
from .events import _BUS
from .runs import Run

__all__ = ["AgentFunction", "agent", "prompt"]

# `events.current_bus`, called without a Python frame of its own.
_current_bus = _BUS.get

if TYPE_CHECKING:
    from collections.abc import Coroutine
    from typing import Protocol

    import typing_extensions

    from ._streams import AsyncRunStream, RunStream
    from .combinators import Pipeline, Stage
    from .runs import Budget

    # Bare `AgentFunction` means `AgentFunction[..., Any]` (COMP-46).
    P = typing_extensions.ParamSpec("P", default=...)
    R = typing_extensions.TypeVar("R", default=Any)
    _X = TypeVar("_X")
    _Y = TypeVar("_Y")
    _Z = TypeVar("_Z")
    _W = TypeVar("_W")

    class _AgentDecorator(Protocol):
        """Static type of `agent(...)` with options."""

        @overload
        def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> AgentFunction[P, R]: ...
        @overload
        def __call__(self, fn: Callable[P, R], /) -> AgentFunction[P, R]: ...
else:
    P = ParamSpec("P")
    R = TypeVar("R")


def prompt(text_or_messages: Any) -> Any:
    """Returns its argument unchanged; typed `Any` so a structured-output
    agent's body can return its prompt."""
    return text_or_messages


class AgentFunction(Generic[P, R]):
    """An agent made by `@agent`.

    `agent_fn(...)` returns the output (`None` when the run paused);
    `run()` returns the `Run`, `arun()` awaits it, `stream()` and `astream()`
    yield its events. Every method takes the keyword-only overrides
    `budget=`, `system=`, `model=`, `approver=`, `tool_interceptor=` and
    `context_manager=`; other arguments go to the function.
    """

    def __init__(self, fn: Callable[..., Any], **options: Any):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name: str = options["name"]
        self.model = options["model"]
        self.tools = tuple(options["tools"])
        self.temperature = options["temperature"]
        self.max_tokens = options["max_tokens"]
        self.max_turns = options["max_turns"]
        self.retries = options["retries"]
        # A `RetryPolicy` for provider calls (EXT-9); None: `retries`.
        self.retry = options.get("retry")
        self.max_repairs = options["max_repairs"]
        self.timeout = options["timeout"]
        self.prompt_cache = options["prompt_cache"]
        self.thinking = options["thinking"]
        self.effort = options["effort"]
        self.thinking_budget = options["thinking_budget"]
        self.fallback = options["fallback"]
        self.cache = options["cache"]
        # The run stream each text delta is appended to, if any.
        self.stream_to: str | None = options.get("stream_to")
        doc = fn.__doc__
        self.system = inspect.cleandoc(doc) if doc and doc.strip() else None
        self.input_type, self.output_type = _signature_types(fn)
        self._is_async = inspect.iscoroutinefunction(fn)
        self._schema, self._wrapped = _output_schema(self.output_type)
        self._tool_map = {t.name: t for t in self.tools}
        self._tool_specs = [t.spec for t in self.tools] or None

    def __repr__(self) -> str:
        return f"<AgentFunction {self.name!r}>"

    # `>>` type-checks only for agents callable with one positional argument (COMP-43).
    def __rshift__(self: Stage[_X, _Y], other: Stage[_Y, _Z]) -> Pipeline[_X, _Z]:
        from .combinators import chain

        return chain(self, other)

    def __rrshift__(self: Stage[_X, _Y], other: Stage[_W, _X]) -> Pipeline[_W, _Y]:
        from .combinators import chain

        return chain(other, self)

    # -- routing (AGENT-50) ------------------------------------------------

    # Direct calls are checked against the body's parameters (COMP-40); a call passing an
    # override keyword (AGENT-48) matches one of the looser variants instead.
    @overload
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...
    @overload
    def __call__(self, *args: Any, budget: Budget | None, **kwargs: Any) -> R: ...
    @overload
    def __call__(self, *args: Any, system: str | None, **kwargs: Any) -> R: ...
    @overload
    def __call__(self, *args: Any, model: Any, **kwargs: Any) -> R: ...
    @overload
    def __call__(self, *args: Any, approver: Any, **kwargs: Any) -> R: ...
    @overload
    def __call__(self, *args: Any, tool_interceptor: Any, **kwargs: Any) -> R: ...
    @overload
    def __call__(self, *args: Any, context_manager: Any, **kwargs: Any) -> R: ...
    def __call__(
        self,
        *args: Any,
        budget: Any = None,
        # Any: the first overload passes the body's own keywords, whatever their types.
        system: Any = None,
        model: Any = None,
        approver: Any = None,
        tool_interceptor: Any = None,
        context_manager: Any = None,
        **kwargs: Any,
    ) -> R:
        opts = _overrides(budget, system, model, approver, tool_interceptor, context_manager)
        return self._run_sync(args, kwargs, opts, want_run=False)

    def run(
        self,
        *args: Any,
        budget: Any = None,
        system: str | None = None,
        model: Any = None,
        approver: Any = None,
        tool_interceptor: Any = None,
        context_manager: Any = None,
        **kwargs: Any,
    ) -> Run[R]:
        opts = _overrides(budget, system, model, approver, tool_interceptor, context_manager)
        return self._run_sync(args, kwargs, opts, want_run=True)

    async def arun(
        self,
        *args: Any,
        budget: Any = None,
        system: str | None = None,
        model: Any = None,
        approver: Any = None,
        tool_interceptor: Any = None,
        context_manager: Any = None,
        **kwargs: Any,
    ) -> Run[R]:
        opts = _overrides(budget, system, model, approver, tool_interceptor, context_manager)
        return await self._run_async(args, kwargs, opts)

    def stream(self, *args: Any, **kwargs: Any) -> RunStream[R]:
        from ._streams import RunStream

        return RunStream.start(lambda: self.run(*args, **kwargs), cancellable=True)

    def astream(self, *args: Any, **kwargs: Any) -> AsyncRunStream[R]:
        from ._streams import AsyncRunStream

        return AsyncRunStream.start(lambda: self.arun(*args, **kwargs))

    def _run_sync(self, args: tuple, kwargs: dict, opts: dict, want_run: bool) -> Any:
        _engine.check_sync_facade()
        frame = FRAME.get()
        if frame is not None and frame.run is not None and frame.run.kind in ("flow", "graph"):
            result = self._flow_step(frame, args, kwargs, opts)
        elif frame is None or frame.span is None:
            if _plain_standalone(self, opts):
                result = _standalone_plain(self, args, kwargs, opts)
            else:
                result = _standalone_sync(self, args, kwargs, opts)
        else:
            result = self._nested_sync(frame, args, kwargs, opts)
        return result if want_run else result.output

    async def _run_async(self, args: tuple, kwargs: dict, opts: dict) -> Run[R]:
        frame = FRAME.get()
        if frame is not None and frame.run is not None and frame.run.kind in ("flow", "graph"):
            return await self._aflow_step(frame, args, kwargs, opts)
        if frame is None or frame.span is None:
            return await _standalone_async(self, args, kwargs, opts)
        return await self._nested_async(frame, args, kwargs, opts)

    # -- in a flow (AGENT-51) ---------------------------------------------

    def _step_budget(self, frame: Frame, key: str, opts: dict):
        budget = opts["budget"]
        if budget is None:
            return None
        assert frame.run is not None  # a step of a flow's run
        baseline = frame.run.attempt.prior_llm_usage(key)
        return _engine.budget_meter(budget, "agent", self.name, baseline)

    def _flow_step(self, frame: Frame, args: tuple, kwargs: dict, opts: dict) -> Run[R]:
        holder: dict[str, Any] = {}

        def execute(inner: Frame, a: tuple, k: dict) -> Any:
            call = _Call(self, opts, inner, frame.scope)
            call.snapshot_scope = inner.scope
            holder["call"] = call
            meter = self._step_budget(frame, inner.scope, opts)
            token = _push_budget(meter)
            try:
                return _agent_loop_sync(call, a, k)
            finally:
                _pop_budget(token)

        output = _engine.journaled_step(frame, "agent", self.name, execute, args, kwargs)
        return self._step_run(frame, holder, output)

    async def _aflow_step(self, frame: Frame, args: tuple, kwargs: dict, opts: dict) -> Run[R]:
        holder: dict[str, Any] = {}

        async def execute(inner: Frame, a: tuple, k: dict) -> Any:
            call = _Call(self, opts, inner, frame.scope)
            call.snapshot_scope = inner.scope
            holder["call"] = call
            meter = self._step_budget(frame, inner.scope, opts)
            token = _push_budget(meter)
            try:
                return await _agent_loop_async(call, a, k)
            finally:
                _pop_budget(token)

        output = await _engine.ajournaled_step(frame, "agent", self.name, execute, args, kwargs)
        return self._step_run(frame, holder, output)

    def _step_run(self, frame: Frame, holder: dict, output: Any) -> Run[R]:
        call = holder.get("call")
        if call is None:  # replayed (FLOW-16)
            return Run(
                id=_core.ulid(),
                status="completed",
                output=output,
                usage=None,
                trace=frame.trace,
                messages=[],
            )
        return Run(
            id=_core.ulid(),
            status="completed",
            output=output,
            usage=_drive.subtree_usage(frame.trace, call.frame.span),
            trace=frame.trace,
            messages=list(call.messages),
        )

    # -- nested plain run (no row) -----------------------------------------

    def _nested_open(self, frame: Frame, args: tuple, kwargs: dict, opts: dict) -> _Call:
        span = _engine.open_span(frame.span, frame.trace, "agent", self.name)
        if _engine._capture():
            span.input = {"args": list(args), "kwargs": kwargs}
        inner = Frame(frame.run, frame.scope, span, frame.fence, frame.trace)
        call = _Call(self, opts, inner, frame.scope)
        if frame.run is not None:
            # Inside a durable run (e.g. a tool body, which re-runs from its
            # start on resume) the k-th call of this agent in this scope
            # keeps its snapshot under a deterministic key.
            call.snapshot_scope = frame.run.attempt.next_key(frame.scope, self.name, frame.fence)
        return call

    def _nested_done(self, call: _Call, output: Any) -> Run[R]:
        _engine.close_span(call.run, call.frame.span, output)
        return Run(
            id=_core.ulid(),
            status="completed",
            output=output,
            usage=_drive.subtree_usage(call.frame.trace, call.frame.span),
            trace=call.frame.trace,
            messages=list(call.messages),
        )

    def _nested_sync(self, frame: Frame, args: tuple, kwargs: dict, opts: dict) -> Run[R]:
        call = self._nested_open(frame, args, kwargs, opts)
        token = FRAME.set(call.frame)
        budget_token = _push_budget(_engine.budget_meter(opts["budget"], "agent", self.name))
        try:
            output = _agent_loop_sync(call, args, kwargs)
        except BaseException as exc:
            _engine.fail_span(call.run, call.frame.span, exc)
            raise
        finally:
            _pop_budget(budget_token)
            FRAME.reset(token)
        return self._nested_done(call, output)

    async def _nested_async(self, frame: Frame, args: tuple, kwargs: dict, opts: dict) -> Run[R]:
        call = self._nested_open(frame, args, kwargs, opts)
        token = FRAME.set(call.frame)
        budget_token = _push_budget(_engine.budget_meter(opts["budget"], "agent", self.name))
        try:
            output = await _agent_loop_async(call, args, kwargs)
        except BaseException as exc:
            _engine.fail_span(call.run, call.frame.span, exc)
            raise
        finally:
            _pop_budget(budget_token)
            FRAME.reset(token)
        return self._nested_done(call, output)


# ---------------------------------------------------------------------------
# @agent


@overload
def agent(fn: Callable[P, Coroutine[Any, Any, R]], /) -> AgentFunction[P, R]: ...
@overload
def agent(fn: Callable[P, R], /) -> AgentFunction[P, R]: ...
@overload
def agent(
    *,
    model: Any = None,
    tools: Any = (),
    temperature: float | None = None,
    max_tokens: int = 16000,
    max_turns: int | None = 10,
    retries: int = 0,
    max_repairs: int = 0,
    timeout: float | None = None,
    prompt_cache: bool = True,
    thinking: bool | None = None,
    effort: str | None = None,
    thinking_budget: int | None = None,
    fallback: Any = None,
    cache: bool = False,
    name: str | None = None,
    replace: bool = False,
    retry: Any = None,
    stream_to: str | None = None,
) -> _AgentDecorator: ...
def agent(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    model: Any = None,
    tools: Any = (),
    temperature: float | None = None,
    max_tokens: int = 16000,
    max_turns: int | None = 10,
    retries: int = 0,
    max_repairs: int = 0,
    timeout: float | None = None,
    prompt_cache: bool = True,
    thinking: bool | None = None,
    effort: str | None = None,
    thinking_budget: int | None = None,
    fallback: Any = None,
    cache: bool = False,
    name: str | None = None,
    replace: bool = False,
    retry: Any = None,
    stream_to: str | None = None,
):
    """Declares an agent: a typed function backed by a language model.

    The docstring is the system prompt, the body returns the user prompt
    (`prompt(...)` or a `str`), and the return annotation is the output type:
    `str` for the model's text, any other type as validated structured
    output. Calling the agent returns its output; `.run()` returns the `Run`.
    Inside a flow a call is one journaled step, replayed without calling the
    model again.

    Args:
        model: a model string (`"anthropic/claude-sonnet-5"`,
            `"openai/gpt-5.4"`) or a model object (`complete(request)`).
        tools: the `Tool`s (or `@tool` functions) the model may call.
        temperature: sent with every request when given.
        max_tokens: the cap on each reply's tokens.
        max_turns: model calls allowed before `MaxTurnsExceededError`
            (`None`: no limit).
        retries: attempts again after a `ProviderError`, this many times.
        max_repairs: times an invalid structured output is sent back to the
            model to fix.
        timeout: seconds for the whole agent call (`AgentTimeoutError`).
        prompt_cache: mark prompt-cache breakpoints where the provider has them.
        thinking: turn the provider's reasoning on or off.
        effort: the provider's reasoning effort level.
        thinking_budget: the reasoning token budget.
        fallback: a model tried when the model still fails after its retries.
        cache: reuse the stored response of an identical earlier request.
        name: the registered name (default: the function's name); unique per
            process.
        replace: rebind a name that is already registered.
        retry: a `RetryPolicy` for provider calls, instead of `retries=`.
        stream_to: the name of a stream of the run (`compose.read_stream`)
            that each text delta of a call made in a durable run is appended
            to, in batches.
    """
    if stream_to is not None and (not isinstance(stream_to, str) or not stream_to):
        raise ConfigError(f"@agent(stream_to=...) must be a non-empty str, got {stream_to!r}")

    def decorate(f: Callable[..., Any]) -> AgentFunction:
        agent_name = name or f.__name__
        policy = None
        if retry is not None:
            from ._retry import resolve

            policy = resolve(f"@agent {agent_name!r}", retries, retry)
        if agent_name in _AGENTS and not replace:
            raise ConfigError(
                f"@agent name {agent_name!r} is already registered -- agent names must be unique "
                "per process (needed so resume() can route a paused agent run back to its "
                "definition); pass name=... or replace=True, or rename the function"
            )
        obj = AgentFunction(
            f,
            model=model,
            tools=tools,
            temperature=temperature,
            max_tokens=max_tokens,
            max_turns=max_turns,
            retries=retries,
            max_repairs=max_repairs,
            timeout=timeout,
            prompt_cache=prompt_cache,
            thinking=thinking,
            effort=effort,
            thinking_budget=thinking_budget,
            fallback=fallback,
            cache=cache,
            name=agent_name,
            retry=policy,
            stream_to=stream_to,
        )
        _AGENTS[agent_name] = obj
        _codec.register_annotation_types(f)
        return obj

    if fn is not None:
        return decorate(fn)
    return decorate


def run_conversation_step(agent: AgentFunction, messages: list) -> tuple[Any, list]:
    """Runs `agent` on `messages` (instead of its body's prompt) as a
    journaled step of the current durable run: a graph's agent node. Returns the output and the whole transcript."""
    frame = FRAME.get()
    assert frame is not None  # a graph's agent node runs as a step of its run
    opts = _overrides(None, None, None, None, None, None)

    def execute(inner: Frame, a: tuple, k: dict) -> Any:
        call = _Call(agent, opts, inner, frame.scope)
        call.snapshot_scope = inner.scope
        driver = _engine.driven_synchronously()
        try:
            call.resolve_model()
            if not _restore(call):
                call.messages = list(messages)
            output = _drive_sync(_loop(call))
        finally:
            _engine.ASYNC_DRIVER.reset(driver)
        return {"output": output, "messages": list(call.messages)}

    value = _engine.journaled_step(frame, "agent", agent.name, execute, (), {})
    return value["output"], list(value["messages"])
