"""`RetryPolicy`, kept apart so that `@task` can check it without
loading `composeai.durable`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import ConfigError, TaskTimeoutError


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _exception_types(value: Any, field: str) -> None:
    ok = isinstance(value, tuple) and all(
        isinstance(t, type) and issubclass(t, BaseException) for t in value
    )
    if not ok:
        raise ConfigError(f"RetryPolicy: {field} must be a tuple of exception types, got {value!r}")


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and after what delay, a failed step or run is attempted
    again. The delay before attempt k (k >= 2) is
    `min(initial_backoff * backoff_factor ** (k - 2), max_backoff)`, then
    +/- `jitter` as a fraction of it."""

    max_attempts: int = 3
    initial_backoff: float = 1.0
    backoff_factor: float = 2.0
    max_backoff: float = 60.0
    jitter: float = 0.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    non_retryable: tuple[type[BaseException], ...] = ()

    NONE: ClassVar[RetryPolicy]

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool):
            raise ConfigError(
                f"RetryPolicy: max_attempts must be an int, got {self.max_attempts!r}"
            )
        if self.max_attempts < 1:
            raise ConfigError(f"RetryPolicy: max_attempts must be >= 1, got {self.max_attempts}")
        for field in ("initial_backoff", "backoff_factor", "max_backoff"):
            value = getattr(self, field)
            if not _number(value) or value < 0:
                raise ConfigError(f"RetryPolicy: {field} must be a number >= 0, got {value!r}")
        if not _number(self.jitter) or not 0 <= self.jitter <= 1:
            raise ConfigError(f"RetryPolicy: jitter must be between 0 and 1, got {self.jitter!r}")
        _exception_types(self.retry_on, "retry_on")
        _exception_types(self.non_retryable, "non_retryable")

    def retries(self, exc: BaseException) -> bool:
        """Whether `exc` may be retried (never a `TaskTimeoutError`)."""
        if isinstance(exc, TaskTimeoutError):
            return False
        return isinstance(exc, self.retry_on) and not isinstance(exc, self.non_retryable)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt number `attempt` (2 for the first retry)."""
        base = min(self.initial_backoff * self.backoff_factor ** (attempt - 2), self.max_backoff)
        if self.jitter and base:
            import random

            base *= 1 + random.uniform(-self.jitter, self.jitter)
        return max(0.0, base)


RetryPolicy.NONE = RetryPolicy(max_attempts=1, initial_backoff=0.0)
RetryPolicy.__module__ = "composeai.durable"


def resolve(owner: str, retries: Any, retry: Any) -> RetryPolicy | None:
    """The policy of a decorator given `retries=` and `retry=` (None: the
    0.11.0 `retries` behaviour)."""
    if retry is None:
        return None
    if retries:
        raise ConfigError(f"{owner}: pass either retries= or retry=, not both")
    if not isinstance(retry, RetryPolicy):
        raise ConfigError(f"{owner}: retry= must be a RetryPolicy, got {type(retry).__name__}")
    return retry
