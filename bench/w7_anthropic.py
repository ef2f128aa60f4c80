"""W7: N calls of an @agent whose model is AnthropicModel (the real SDK, over HTTP to a
loopback Messages API server in this process) vs N bare SDK `client.messages.create` calls
to the same server. Each agent call is a standalone durable agent run. Reports the per-call
overhead of composeai over the bare SDK, and the adapter alone (`model.complete()`) too.

A fourth side makes the same SDK call through its raw response and decodes the JSON body,
as the adapter does: `overhead_vs_raw_sdk_ms_per_call` (agent − that call) is what composeai
adds to the cheapest use of the SDK, since the adapter itself skips the typed reply the
bare call builds.

The sides are interleaved call by call, the first of each round rotating, so drift,
neighbours' load and the store's background work hit every side alike; figures are medians,
and each overhead is the median of the paired differences (as `w7_openai.py` measures)."""

from __future__ import annotations

import os
import sys
import time
from statistics import median

from _common import REPO, emit, fresh_store, parser, sync_mode

sys.path.insert(0, os.path.join(REPO, "tests"))

MODEL = "claude-sonnet-5"


def main() -> None:
    args = parser(__doc__.splitlines()[0], 1000).parse_args()
    n = args.n
    fresh_store("w7")

    import anthropic

    import _anthropic_wire as w
    from composeai import agent
    from composeai.messages import Message
    from composeai.models.anthropic import AnthropicModel
    from composeai.models.base import ModelRequest

    server = w.WireServer().start()
    reply = w.JsonReply(w.message(w.text("Hello!"), usage_=w.usage(20, 5)))
    # One reply per request: four measured sides, plus warm-ups.
    server.push(*[reply] * (4 * n + 40))

    model = AnthropicModel(MODEL, api_key="bench", base_url=server.url, max_retries=0)
    bare = anthropic.Anthropic(api_key="bench", base_url=server.url, max_retries=0)

    @agent(model=model)
    def greeter(name: str) -> str:
        """Greet the user."""
        return f"Say hello to {name}."

    def agent_call(i: int) -> None:
        run = greeter.run(str(i))
        assert run.status == "completed" and run.output == "Hello!"

    # The bare side sends the very JSON the agent sends (block-form content, the system block
    # with its cache breakpoint), so the difference is composeai's own cost.
    system = [{"type": "text", "text": "Greet the user.", "cache_control": {"type": "ephemeral"}}]

    def bare_call(i: int) -> None:
        message = bare.messages.create(
            model=MODEL,
            max_tokens=16000,
            system=system,
            messages=[
                {"role": "user", "content": [{"type": "text", "text": f"Say hello to {i}."}]}
            ],
        )
        assert message.content[0].text == "Hello!"

    def raw_call(i: int) -> None:
        # The same request through the SDK's raw response, its JSON body decoded: the SDK
        # without its typed reply, as the adapter uses it; the agent against this side is
        # what composeai adds to the cheapest SDK call.
        raw = bare.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=16000,
            system=system,
            messages=[
                {"role": "user", "content": [{"type": "text", "text": f"Say hello to {i}."}]}
            ],
        )
        assert raw.http_response.json()["content"][0]["text"] == "Hello!"

    def adapter_call(i: int) -> None:
        request = ModelRequest(
            model=MODEL,
            messages=[Message.user(f"Say hello to {i}.")],
            system="Greet the user.",
            prompt_cache=True,
        )
        assert model.complete(request).message.text == "Hello!"

    sides = {"agent": agent_call, "bare": bare_call, "raw": raw_call, "adapter": adapter_call}
    for i in range(10):  # warm-up: connections, the store, first-call imports
        for fn in sides.values():
            fn(i)
    samples: dict[str, list[float]] = {k: [] for k in sides}
    clock = time.perf_counter
    order = list(sides.items())
    for i in range(n):
        # The side that goes first rotates: a call made right after another's
        # commit (the store's writer and checkpointer busy) is not always the same side.
        k = i % len(order)
        for name, fn in order[k:] + order[:k]:
            t0 = clock()
            fn(i)
            samples[name].append((clock() - t0) * 1e3)
    server.close()

    def paired(side: str, base: str = "bare") -> float:
        return round(median(a - b for a, b in zip(samples[side], samples[base])), 4)

    emit(
        {
            "workload": "W7",
            "n": n,
            "sync": sync_mode(),
            "anthropic_sdk": anthropic.__version__,
            "overhead_ms_per_call": paired("agent"),
            "composeai_ms_per_call": round(median(samples["agent"]), 4),
            "bare_sdk_ms_per_call": round(median(samples["bare"]), 4),
            "adapter_overhead_ms_per_call": paired("adapter"),
            "adapter_ms_per_call": round(median(samples["adapter"]), 4),
            "raw_sdk_ms_per_call": round(median(samples["raw"]), 4),
            "overhead_vs_raw_sdk_ms_per_call": paired("agent", "raw"),
        }
    )


if __name__ == "__main__":
    main()
