"""Resolution of ``'provider/model-id'`` strings to model instances.

Import stays cheap: neither pydantic nor any provider SDK is imported until a model is
actually resolved. Library code must look ``resolve`` up at call time
(``registry.resolve(...)``) so testing hooks that swap it out take effect.
"""

from __future__ import annotations

import threading

from composeai.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from composeai.models.base import Model


__all__ = ["parse_model_string", "register_provider", "resolve"]

# Built-in providers: adapter module ``composeai.models.<name>`` exposing ``create_model``;
# the value is the SDK's top-level package (named by the ``composeai[<name>]`` extra).
_BUILTIN: dict[str, str] = {"anthropic": "anthropic", "openai": "openai"}

# Providers added with register_provider(); they take precedence over the built-ins.
_FACTORIES: dict[str, Callable[[str], Any]] = {}

# (provider, model_id) -> model instance, for the life of the process.
_CACHE: dict[tuple[str, str], Any] = {}
_LOCK = threading.RLock()


def _known() -> str:
    return ", ".join(sorted(set(_BUILTIN) | set(_FACTORIES)))


def parse_model_string(s: str) -> tuple[str, str]:
    """Split ``s`` at its first ``/`` into ``(provider, model_id)``."""
    provider, sep, model_id = s.partition("/")
    if not sep or not provider or not model_id:
        raise ConfigError(
            f"Invalid model string '{s}': expected 'provider/model-id'. Known providers: {_known()}"
        )
    return provider, model_id


def register_provider(name: str, factory: Callable[[str], Model]) -> None:
    """Make ``'<name>/<model-id>'`` resolve to ``factory(model_id)``.

    Overrides a built-in provider of the same name. Instances cached for ``name`` are
    dropped, so the new factory takes effect for every model id.
    """
    with _LOCK:
        _FACTORIES[name] = factory
        for key in [k for k in _CACHE if k[0] == name]:
            del _CACHE[key]


def _install_error(provider: str) -> ConfigError:
    return ConfigError(f"Install the provider SDK: pip install 'composeai[{provider}]'")


def _is_sdk_missing(exc: ModuleNotFoundError, sdk: str) -> bool:
    name = exc.name or ""
    return name == sdk or name.startswith(sdk + ".")


def _builtin_factory(provider: str) -> Callable[[str], Any]:
    import importlib

    module_name = f"composeai.models.{provider}"
    sdk = _BUILTIN[provider]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise ConfigError(
                f"provider '{provider}' has no adapter in this build of composeai yet -- "
                "pass a Model instance (e.g. composeai.testing.FakeModel) or "
                f"register_provider('{provider}', factory)"
            ) from None
        if _is_sdk_missing(exc, sdk):
            raise _install_error(provider) from exc
        raise
    create_model = module.create_model

    def factory(model_id: str) -> Any:
        try:
            return create_model(model_id)
        except ModuleNotFoundError as exc:
            if _is_sdk_missing(exc, sdk):
                raise _install_error(provider) from exc
            raise

    return factory


def _is_model(obj: object) -> bool:
    # What the runtime-checkable protocol checks, without its per-call
    # attribute scan.
    return callable(getattr(obj, "complete", None))


def resolve(model: str | Model) -> Model:
    """A ``Model`` instance passes through; a model string resolves to a cached instance."""
    if isinstance(model, str):
        provider, model_id = parse_model_string(model)
        key = (provider, model_id)
        cached = _CACHE.get(key)
        if cached is not None:
            return cached
        with _LOCK:
            cached = _CACHE.get(key)
            if cached is not None:
                return cached
            factory = _FACTORIES.get(provider)
            if factory is None:
                if provider not in _BUILTIN:
                    raise ConfigError(
                        f"Unknown provider '{provider}' in model string '{model}'. "
                        f"Known providers: {_known()}"
                    )
                factory = _builtin_factory(provider)
            instance = factory(model_id)
            _CACHE[key] = instance
            return instance
    if _is_model(model):
        return model
    raise ConfigError(
        f"model must be a 'provider/model-id' string or a Model instance, got {type(model)!r}"
    )
