"""The exception hierarchy of composeai."""

from __future__ import annotations

__all__ = [
    "AgentTimeoutError",
    "BudgetExceededError",
    "ComposeError",
    "CompositionTypeError",
    "ConfigError",
    "MCPToolError",
    "MaxTurnsExceededError",
    "ModelRefusalError",
    "NondeterminismError",
    "NondeterminismWarning",
    "ProviderError",
    "ResumeMismatchError",
    "SerializationError",
    "StageTypeError",
    "TaskTimeoutError",
]


class ComposeError(Exception):
    """Base class of every composeai error."""


class ConfigError(ComposeError):
    """Misuse of the API or an unusable store."""


class ProviderError(ComposeError):
    """A model provider failed or answered with something unusable."""

    def __init__(self, message: str = "", *, provider: str | None = None, model: str | None = None):
        super().__init__(message)
        self.provider = provider
        self.model = model

    def __reduce__(self):
        return (_rebuild_provider_error, (str(self), self.provider, self.model))


def _rebuild_provider_error(message, provider, model):
    return ProviderError(message, provider=provider, model=model)


class SerializationError(ComposeError):
    """A value cannot be encoded or decoded."""


class ResumeMismatchError(ComposeError):
    """A flow's source changed since the run being resumed was created."""


class NondeterminismError(ComposeError):
    """A resumed (or replayed) body no longer makes the calls its run
    journaled: at journal key `key` the run recorded `recorded` and the body
    now makes `called`. Nothing new is journaled; the run resumes
    once the code that made the journaled calls is back."""

    def __init__(
        self,
        message: str = "",
        *,
        run_id: str = "",
        key: str = "",
        recorded: str = "",
        called: str = "",
    ):
        super().__init__(message)
        self.run_id = run_id
        self.key = key
        self.recorded = recorded
        self.called = called

    def __reduce__(self):
        return (
            _rebuild_nondeterminism,
            (str(self), self.run_id, self.key, self.recorded, self.called),
        )


def _rebuild_nondeterminism(message, run_id, key, recorded, called):
    return NondeterminismError(message, run_id=run_id, key=key, recorded=recorded, called=called)


class NondeterminismWarning(UserWarning):
    """What `@flow(on_divergence="warn")` emits instead of raising
    `NondeterminismError` (once per attempt)."""


class _ReplayEnd(BaseException):
    """Ends a replay-only run (`composeai.testing.replay`) where its journal
    ends: the step at `key` would execute next. Internal."""

    def __init__(self, message: str, key: str):
        super().__init__(message)
        self.key = key


class BudgetExceededError(ComposeError):
    """An active budget was crossed after an LLM call."""


class CompositionTypeError(ComposeError, TypeError):
    """Stages that cannot be composed, detected before anything runs."""


class StageTypeError(ComposeError, TypeError):
    """A runtime value does not fit a stage's declared input type."""


class MaxTurnsExceededError(ComposeError):
    """An agent used up its turns."""


class ModelRefusalError(ComposeError):
    """The model refused to answer."""

    def __init__(self, message: str = "", *, raw: str | None = None):
        super().__init__(message)
        self.raw = raw

    def __reduce__(self):
        return (_rebuild_refusal, (str(self), self.raw))


def _rebuild_refusal(message, raw):
    return ModelRefusalError(message, raw=raw)


class AgentTimeoutError(ComposeError):
    """An agent exceeded its timeout."""


class TaskTimeoutError(ComposeError):
    """A task, map item or aggregate branch exceeded its timeout."""


class MCPToolError(ComposeError):
    """An MCP tool call or listing failed."""
