"""W7: what composeai adds to a real OpenAI SDK call. A loopback server in this process speaks
the Responses API and Chat Completions; N standalone @agent calls (each a durable run with its
llm span) go through OpenAIModel / OpenAICompatibleModel, next to N bare SDK calls sending the
same request to the same server, and N bare adapter calls (``model.complete``), interleaved
call by call (the kind that goes first rotating). Figures are medians.

``*_overhead_ms_per_call`` = agent call − bare SDK call (median of the paired differences);
``*_adapter_overhead_ms_per_call`` = ``model.complete`` − bare SDK call (the wire mapping
alone, less the typed reply the adapters skip by reading the raw body);
``*_overhead_vs_raw_sdk_ms_per_call`` = agent call − the same SDK call through its raw
response with the JSON body decoded (what composeai adds to the cheapest SDK call); ``fake_agent_ms_per_call`` is the same agent on a FakeModel (the engine's share, as
W5), and ``blocking_fake_agent_overhead_ms_per_call`` the engine's share when the model call
blocks for as long as a bare SDK call (a model that sleeps, against the bare sleep)."""

from __future__ import annotations

import os
import sys
import time
from statistics import median

from _common import REPO, emit, fresh_store, parser

sys.path.insert(0, os.path.join(REPO, "tests"))

import _openai_wire as wire


def main() -> None:
    args = parser(__doc__.splitlines()[0], 300).parse_args()
    n = args.n
    fresh_store("w7")

    import openai

    from composeai import agent
    from composeai.messages import Message
    from composeai.models import compatible
    from composeai.models import openai as oai
    from composeai.models.base import ModelRequest
    from composeai.testing import FakeModel

    server = wire.WireServer()
    responses_reply = wire.Reply(body=wire.response([wire.message_item("hello")]))
    chat_reply = wire.Reply(body=wire.completion("hello"))

    def serve(reply):
        server.repeat = reply
        server.replies.clear()

    o_model = oai.OpenAIModel("gpt-5.4", api_key="k", base_url=server.url)
    c_model = compatible.OpenAICompatibleModel("local", base_url=server.url, api_key="k")
    bare = openai.OpenAI(api_key="k", base_url=server.url)
    request = ModelRequest(model="gpt-5.4", messages=[Message.user("Say hello to user.")])
    o_kwargs = oai.request_kwargs(request, "gpt-5.4")
    c_kwargs = compatible.request_kwargs(request, "local", "native")
    fake = FakeModel(["hello"] * (n + 2))

    def greeter(name: str) -> str:
        return f"Say hello to {name}."

    o_agent = agent(model=o_model, name="w7_openai", prompt_cache=False)(greeter)
    c_agent = agent(model=c_model, name="w7_compat", prompt_cache=False)(greeter)
    f_agent = agent(model=fake, name="w7_fake", prompt_cache=False)(greeter)
    blocking = _Blocking()
    b_agent = agent(model=blocking, name="w7_blocking", prompt_cache=False)(greeter)

    def o_sdk():
        bare.responses.create(**o_kwargs)

    def c_sdk():
        bare.chat.completions.create(**c_kwargs)

    # The same calls through the SDK's raw response, the JSON body decoded (as the adapters
    # read a reply): the SDK without its typed reply.
    def o_raw():
        bare.responses.with_raw_response.create(**o_kwargs).http_response.json()

    def c_raw():
        bare.chat.completions.with_raw_response.create(**c_kwargs).http_response.json()

    groups = {
        "openai": (
            responses_reply,
            {
                "sdk": o_sdk,
                "raw_sdk": o_raw,
                "adapter": lambda: o_model.complete(request),
                "agent": lambda: o_agent.run("user"),
            },
        ),
        "compatible": (
            chat_reply,
            {
                "sdk": c_sdk,
                "raw_sdk": c_raw,
                "adapter": lambda: c_model.complete(request),
                "agent": lambda: c_agent.run("user"),
            },
        ),
    }
    serve(responses_reply)
    assert o_agent.run("warm-up").output == "hello"
    serve(chat_reply)
    assert c_agent.run("warm-up").output == "hello"
    assert f_agent.run("warm-up").output == "hello"
    for reply, fns in groups.values():
        serve(reply)
        for fn in fns.values():
            fn()
    server.requests.clear()

    result: dict[str, float] = {}
    clock = time.perf_counter
    for group, (reply, fns) in groups.items():
        serve(reply)
        samples: dict[str, list[float]] = {k: [] for k in fns}
        # Interleaved per call, so drift and neighbours' load hit every kind alike; the
        # overhead is the median of the paired differences.
        # The kind that goes first rotates, so none always follows another's commit.
        order = list(fns.items())
        for i in range(n):
            k = i % len(order)
            for kind, fn in order[k:] + order[:k]:
                t0 = clock()
                fn()
                samples[kind].append((clock() - t0) * 1e3)
        for kind, values in samples.items():
            result[f"{group}_{kind}_ms_per_call"] = _r(median(values))
        result[f"{group}_overhead_ms_per_call"] = _r(
            median(a - b for a, b in zip(samples["agent"], samples["sdk"]))
        )
        result[f"{group}_adapter_overhead_ms_per_call"] = _r(
            median(a - b for a, b in zip(samples["adapter"], samples["sdk"]))
        )
        result[f"{group}_overhead_vs_raw_sdk_ms_per_call"] = _r(
            median(a - b for a, b in zip(samples["agent"], samples["raw_sdk"]))
        )
    fake_samples = []
    for _ in range(n):
        t0 = clock()
        f_agent.run("user")
        fake_samples.append((clock() - t0) * 1e3)
    result["fake_agent_ms_per_call"] = _r(median(fake_samples))
    # The engine's share when the model call blocks (as any network call does): a model
    # that sleeps as long as a bare SDK call, against the bare sleep.
    pause = result["openai_sdk_ms_per_call"] / 1e3
    blocking.pause = pause
    paired = []
    for _ in range(n):
        t0 = clock()
        time.sleep(pause)
        t1 = clock()
        b_agent.run("user")
        paired.append(((clock() - t1) - (t1 - t0)) * 1e3)
    result["blocking_fake_agent_overhead_ms_per_call"] = _r(median(paired))
    sent = len(server.requests)
    server.close()
    assert sent == 8 * n, sent
    emit({"workload": "W7", "n": n, **result})


class _Blocking:
    """A model whose call blocks for ``pause`` seconds, then says hello."""

    model_id = "blocking"
    pause = 0.0

    def complete(self, request):
        from composeai.messages import Message, StopReason, Usage
        from composeai.models.base import ModelResponse

        time.sleep(self.pause)
        return ModelResponse(
            message=Message.assistant("hello"),
            stop_reason=StopReason.END_TURN,
            raw_stop_reason="stop",
            usage=Usage(input_tokens=10, output_tokens=5),
            model_id="blocking",
        )


def _r(x: float) -> float:
    return round(x, 4)


if __name__ == "__main__":
    main()
