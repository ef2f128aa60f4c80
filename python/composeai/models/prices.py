"""Model prices in USD per million tokens and cost computation."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from composeai import _codec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from composeai.messages import Usage

__all__ = [
    "PRICES_AS_OF",
    "ModelPrice",
    "compute_cost",
    "get_price",
    "register_price",
    "resolve_price",
]

PRICES_AS_OF = "2026-07-12"
"""The date the built-in prices were last checked against the providers' lists."""

# Unset cache prices resolve to these multiples of the input price (PROV-30).
_CACHE_READ_MULT = 0.1
_CACHE_WRITE_5M_MULT = 1.25
_CACHE_WRITE_1H_MULT = 2.0


@dataclass(frozen=True)
class ModelPrice:
    """USD per **million** tokens. Unset cache prices derive from ``input`` (resolve_price)."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write_5m: float | None = None
    cache_write_1h: float | None = None


_codec.register_serializable(ModelPrice)


@dataclass(frozen=True)
class _Rates:
    """A price with every cache field resolved: what the cost formulas multiply by."""

    input: float
    output: float
    cache_read: float
    cache_write_5m: float
    cache_write_1h: float


def _rates(price: ModelPrice) -> _Rates:
    """The rates of ``price``, unset cache prices derived from ``input``."""
    return _Rates(
        input=price.input,
        output=price.output,
        cache_read=(
            price.cache_read if price.cache_read is not None else _CACHE_READ_MULT * price.input
        ),
        cache_write_5m=(
            price.cache_write_5m
            if price.cache_write_5m is not None
            else _CACHE_WRITE_5M_MULT * price.input
        ),
        cache_write_1h=(
            price.cache_write_1h
            if price.cache_write_1h is not None
            else _CACHE_WRITE_1H_MULT * price.input
        ),
    )


# Rates per price object, by identity: hashing a price costs more than the
# formula it feeds. The price is kept with its rates, so an id is never reused.
_RESOLVED: dict[int, tuple[ModelPrice, _Rates]] = {}


def resolved_rates(price: ModelPrice) -> _Rates:
    """`_rates(price)`, computed once per price object."""
    entry = _RESOLVED.get(id(price))
    if entry is None or entry[0] is not price:
        if len(_RESOLVED) >= 1024:
            _RESOLVED.clear()
        entry = _RESOLVED[id(price)] = (price, _rates(price))
    return entry[1]


def resolve_price(price: ModelPrice) -> ModelPrice:
    """``price`` with every unset cache field filled: 0.1×, 1.25×, 2.0× ``input``."""
    r = _rates(price)
    return replace(
        price,
        cache_read=r.cache_read,
        cache_write_5m=r.cache_write_5m,
        cache_write_1h=r.cache_write_1h,
    )


def compute_cost(
    usage: Usage,
    price: ModelPrice,
    cache_write_5m_tokens: int = 0,
    cache_write_1h_tokens: int = 0,
) -> float:
    """USD cost of ``usage`` at ``price`` (cache fields resolved)."""
    p = _rates(price)
    return (
        usage.input_tokens * p.input
        + usage.output_tokens * p.output
        + usage.cache_read_tokens * p.cache_read
        + cache_write_5m_tokens * p.cache_write_5m
        + cache_write_1h_tokens * p.cache_write_1h
    ) / 1_000_000


_LOCK = threading.Lock()
_PRICES: dict[tuple[str, str], ModelPrice] = {}


def register_price(provider: str, model: str, price: ModelPrice) -> None:
    """Set the price of ``provider``/``model`` (bare model id) for the process; last wins."""
    with _LOCK:
        _PRICES[(provider, model)] = price


def get_price(provider: str, model: str) -> ModelPrice | None:
    """The registered or built-in price, or ``None`` (never guessed)."""
    return _PRICES.get((provider, model))


def _builtin(provider: str, table: dict[str, ModelPrice]) -> None:
    for model, price in table.items():
        _PRICES[(provider, model)] = price


_builtin(
    "anthropic",
    {
        "claude-fable-5": ModelPrice(input=10.0, output=50.0),
        "claude-opus-4-8": ModelPrice(input=5.0, output=25.0),
        "claude-opus-4-7": ModelPrice(input=5.0, output=25.0),
        "claude-opus-4-6": ModelPrice(input=5.0, output=25.0),
        "claude-sonnet-5": ModelPrice(input=3.0, output=15.0),
        "claude-sonnet-4-6": ModelPrice(input=3.0, output=15.0),
        "claude-haiku-4-5": ModelPrice(input=1.0, output=5.0),
    },
)
_builtin(
    "openai",
    {
        "gpt-5.6-sol": ModelPrice(input=5.0, output=30.0, cache_read=0.50),
        "gpt-5.6-terra": ModelPrice(input=2.5, output=15.0, cache_read=0.25),
        "gpt-5.6-luna": ModelPrice(input=1.0, output=6.0, cache_read=0.10),
        "gpt-5.5": ModelPrice(input=5.0, output=30.0, cache_read=0.50),
        "gpt-5.5-pro": ModelPrice(input=30.0, output=180.0),
        "gpt-5.4": ModelPrice(input=2.5, output=15.0, cache_read=0.25),
        "gpt-5.4-mini": ModelPrice(input=0.75, output=4.5, cache_read=0.075),
        "gpt-5.4-nano": ModelPrice(input=0.20, output=1.25, cache_read=0.02),
        "gpt-5.4-pro": ModelPrice(input=30.0, output=180.0),
        "gpt-5.3-codex": ModelPrice(input=1.75, output=14.0, cache_read=0.175),
    },
)
