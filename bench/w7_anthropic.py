"""W7: N calls of an @agent whose model is AnthropicModel (the real SDK, over HTTP to a
loopback Messages API server in this process) vs N bare SDK `client.messages.create` calls
to the same server. Each agent call is a standalone durable agent run. Reports the per-call
overhead of composeai over the bare SDK, and the adapter alone (`model.complete()`) too.

The two sides run in alternating rounds and each side's best round counts: the machine is
shared and contention only adds time."""

from __future__ import annotations

import os
import sys
import time

from _common import REPO, emit, fresh_store, parser, sync_mode

sys.path.insert(0, os.path.join(REPO, "tests"))

ROUNDS = 5
MODEL = "claude-sonnet-5"


def main() -> None:
    args = parser(__doc__.splitlines()[0], 1000).parse_args()
    n = args.n
    per_round = max(1, n // ROUNDS)
    fresh_store("w7")

    import anthropic

    import _anthropic_wire as w
    from composeai import agent
    from composeai.messages import Message
    from composeai.models.anthropic import AnthropicModel
    from composeai.models.base import ModelRequest

    server = w.WireServer().start()
    reply = w.JsonReply(w.message(w.text("Hello!"), usage_=w.usage(20, 5)))
    # One reply per request: three measured sides, plus warm-ups.
    server.push(*[reply] * (3 * per_round * ROUNDS + 30))

    model = AnthropicModel(MODEL, api_key="bench", base_url=server.url, max_retries=0)
    bare = anthropic.Anthropic(api_key="bench", base_url=server.url, max_retries=0)

    @agent(model=model)
    def greeter(name: str) -> str:
        """Greet the user."""
        return f"Say hello to {name}."

    def agent_calls(k: int) -> None:
        for i in range(k):
            run = greeter.run(str(i))
            assert run.status == "completed" and run.output == "Hello!"

    # The bare side sends the very JSON the agent sends (block-form content, the system block
    # with its cache breakpoint), so the difference is composeai's own cost.
    system = [{"type": "text", "text": "Greet the user.", "cache_control": {"type": "ephemeral"}}]

    def bare_calls(k: int) -> None:
        for i in range(k):
            message = bare.messages.create(
                model=MODEL,
                max_tokens=16000,
                system=system,
                messages=[
                    {"role": "user", "content": [{"type": "text", "text": f"Say hello to {i}."}]}
                ],
            )
            assert message.content[0].text == "Hello!"

    def adapter_calls(k: int) -> None:
        for i in range(k):
            request = ModelRequest(
                model=MODEL,
                messages=[Message.user(f"Say hello to {i}.")],
                system="Greet the user.",
                prompt_cache=True,
            )
            assert model.complete(request).message.text == "Hello!"

    sides = {"agent": agent_calls, "bare": bare_calls, "adapter": adapter_calls}
    for fn in sides.values():
        fn(10)  # warm-up: connections, the store, first-call imports
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(ROUNDS):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            fn(per_round)
            best[name] = min(best[name], (time.perf_counter() - t0) / per_round)
    server.close()

    ms = {k: v * 1e3 for k, v in best.items()}
    emit(
        {
            "workload": "W7",
            "n": per_round * ROUNDS,
            "sync": sync_mode(),
            "anthropic_sdk": anthropic.__version__,
            "overhead_ms_per_call": round(ms["agent"] - ms["bare"], 4),
            "composeai_ms_per_call": round(ms["agent"], 4),
            "bare_sdk_ms_per_call": round(ms["bare"], 4),
            "adapter_overhead_ms_per_call": round(ms["adapter"] - ms["bare"], 4),
            "adapter_ms_per_call": round(ms["adapter"], 4),
        }
    )


if __name__ == "__main__":
    main()
