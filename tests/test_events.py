"""Events, the event bus and run streams (AGENT-80, AGENT-81, AGENT-90 … AGENT-93,
ASYNC-4, ASYNC-12)."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import subprocess
import sys
import threading
import time

import pytest

from composeai._streams import (
    CANCEL_TOKEN,
    AsyncRunStream,
    CancelToken,
    RunStream,
    current_cancel_token,
    use_cancel_token,
)
from composeai.events import (
    AsyncSubscription,
    Event,
    EventBus,
    Subscription,
    current_bus,
    emit,
    use_bus,
)
from composeai.runs import Run

WAIT = 10.0  # upper bound for anything a test waits on; never reached when green

CALLER_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("caller_var", default="unset")


def fake_run(output=None, status="completed"):
    return Run(id="01RUN", status=status, output=output, trace=None)


def in_thread(fn, *args):
    """Run `fn` on a thread; return (thread, results list, errors list)."""
    results, errors = [], []

    def target():
        try:
            results.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 -- reported to the test
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, results, errors


def joined(thread):
    thread.join(WAIT)
    return not thread.is_alive()


# -- AGENT-80: Event ----------------------------------------------------------


def test_event_defaults():
    before = time.time()
    ev = Event("text_delta")
    after = time.time()
    assert ev.kind == "text_delta"
    assert before <= ev.ts <= after
    assert (ev.trace_id, ev.span_id, ev.name, ev.text, ev.data) == (None,) * 5
    assert [f.name for f in dataclasses.fields(Event)] == [
        "kind",
        "ts",
        "trace_id",
        "span_id",
        "name",
        "text",
        "data",
    ]
    assert Event("x").ts != 0 and Event("x", ts=1.5).ts == 1.5


def test_event_is_frozen_and_slotted():
    ev = Event("span_started", trace_id="t", span_id="s", name="n", data={"kind": "agent"})
    assert dataclasses.is_dataclass(ev)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.kind = "other"
    assert not hasattr(ev, "__dict__")
    assert "kind" in Event.__slots__
    assert ev == Event("span_started", ev.ts, "t", "s", "n", None, {"kind": "agent"})


# -- AGENT-81: EventBus, Subscription -----------------------------------------


def test_fan_out_to_several_subscribers_from_several_threads():
    bus = EventBus()
    subs = [bus.subscribe() for _ in range(3)]
    consumers = [in_thread(list, sub) for sub in subs]

    producers, per_producer = 4, 250
    go = threading.Barrier(producers)

    def produce(p):
        go.wait(WAIT)
        for i in range(per_producer):
            bus.emit(Event("text_delta", name=f"p{p}", data={"i": i}))

    threads = [in_thread(produce, p)[0] for p in range(producers)]
    assert all(joined(t) for t in threads)
    bus.close()

    received = []
    for thread, results, errors in consumers:
        assert joined(thread) and not errors
        received.append(results[0])
    # No event lost, each subscriber sees the same total order ...
    assert len(received[0]) == producers * per_producer
    assert received[1] == received[0] and received[2] == received[0]
    # ... and each producer's events in emission order.
    for p in range(producers):
        mine = [ev.data["i"] for ev in received[0] if ev.name == f"p{p}"]
        assert mine == list(range(per_producer))


def test_subscription_close_mid_stream_wakes_a_blocked_consumer():
    bus = EventBus()
    sub = bus.subscribe()
    got = []
    first = threading.Event()

    def consume():
        for ev in sub:
            got.append(ev)
            first.set()

    thread, _, errors = in_thread(consume)
    bus.emit(Event("text_delta", text="a"))
    assert first.wait(WAIT)
    sub.close()  # the consumer is blocked waiting for the next event
    assert joined(thread) and not errors
    bus.emit(Event("text_delta", text="b"))  # not delivered after close
    assert [ev.text for ev in got] == ["a"]
    assert list(sub) == []
    sub.close()  # idempotent
    assert sub.closed and not bus.closed


def test_agent81_close_keeps_delivered_events_and_unsubscribes():
    bus = EventBus()
    sub, other = bus.subscribe(), bus.subscribe()
    bus.emit(Event("text_delta", text="a"))
    sub.close()
    bus.emit(Event("text_delta", text="b"))
    bus.close()
    assert [ev.text for ev in sub] == ["a"]
    assert list(sub) == []
    assert [ev.text for ev in other] == ["a", "b"]


def test_bus_close_ends_after_queued_events_and_second_iteration_returns_at_once():
    bus = EventBus()
    sub = bus.subscribe()
    for i in range(3):
        bus.emit(Event("text_delta", text=str(i)))
    bus.close()
    bus.close()  # idempotent
    bus.emit(Event("text_delta", text="late"))  # dropped
    assert [ev.text for ev in sub] == ["0", "1", "2"]
    assert list(sub) == []
    assert list(bus.subscribe()) == []  # subscribing to a closed bus: ends at once


def test_subscription_context_manager():
    bus = EventBus()
    with bus.subscribe() as sub:
        assert isinstance(sub, Subscription)
        bus.emit(Event("text_delta"))
        assert next(sub).kind == "text_delta"
    assert sub.closed
    bus.emit(Event("text_delta"))
    assert list(sub) == []


def test_blocking_iteration_ends_when_the_producer_closes_the_bus():
    bus = EventBus()
    sub = bus.subscribe()
    thread, results, errors = in_thread(list, sub)
    time.sleep(0.05)  # let the consumer block
    bus.emit(Event("text_delta", text="x"))
    bus.close()
    assert joined(thread) and not errors
    assert [ev.text for ev in results[0]] == ["x"]


def test_asubscribe_without_a_running_loop_raises():
    with pytest.raises(RuntimeError):
        EventBus().asubscribe()


def test_async_subscription_receives_events_from_another_thread():
    async def main():
        bus = EventBus()
        sub = bus.asubscribe()
        assert isinstance(sub, AsyncSubscription)

        def produce():
            for i in range(500):
                bus.emit(Event("text_delta", text=str(i)))
            bus.close()

        thread, _, errors = in_thread(produce)
        got = [ev.text async for ev in sub]
        assert joined(thread) and not errors
        assert got == [str(i) for i in range(500)]
        assert [ev async for ev in sub] == []  # second iteration returns at once

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_async_subscription_close_mid_stream_and_context_manager():
    async def main():
        bus = EventBus()
        async with bus.asubscribe() as sub:
            got = []

            async def consume():
                async for ev in sub:
                    got.append(ev.text)

            consumer = asyncio.create_task(consume())
            bus.emit(Event("text_delta", text="a"))
            while not got:
                await asyncio.sleep(0.001)
            # Closing from another thread wakes the waiting consumer.
            thread, _, errors = in_thread(sub.close)
            await asyncio.wait_for(consumer, WAIT)
            assert joined(thread) and not errors
            bus.emit(Event("text_delta", text="b"))
            assert got == ["a"]
        assert sub.closed
        assert [ev async for ev in sub] == []

        async with bus.asubscribe() as sub2:
            bus.emit(Event("text_delta", text="c"))
        bus.emit(Event("text_delta", text="d"))
        assert sub2.closed and [ev.text async for ev in sub2] == ["c"]

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_events_for_a_closed_loop_are_dropped():
    bus = EventBus()

    async def subscribe_and_wait():
        sub = bus.asubscribe()
        waiter = asyncio.ensure_future(sub.__anext__())
        await asyncio.sleep(0)
        waiter.cancel()
        return sub

    sub = asyncio.run(subscribe_and_wait())
    other = bus.subscribe()
    bus.emit(Event("text_delta"))  # the loop is closed: no error, nothing kept
    assert sub.closed
    bus.close()
    assert len(list(other)) == 1


# -- AGENT-81: the ambient bus ------------------------------------------------


def test_emit_is_a_no_op_without_a_bus():
    assert current_bus() is None
    assert emit(Event("text_delta")) is None


def test_use_bus_nests_and_restores():
    outer, inner = EventBus(), EventBus()
    outer_sub, inner_sub = outer.subscribe(), inner.subscribe()
    with use_bus(outer) as b:
        assert b is outer and current_bus() is outer
        emit(Event("text_delta", text="1"))
        with use_bus(inner):
            assert current_bus() is inner
            emit(Event("text_delta", text="2"))
            with use_bus(None):
                assert current_bus() is None
                emit(Event("text_delta", text="hidden"))
            assert current_bus() is inner
        assert current_bus() is outer
        emit(Event("text_delta", text="3"))
    assert current_bus() is None
    outer.close()
    inner.close()
    assert [ev.text for ev in outer_sub] == ["1", "3"]
    assert [ev.text for ev in inner_sub] == ["2"]


def test_use_bus_restores_on_error():
    bus = EventBus()
    with pytest.raises(ValueError), use_bus(bus):
        raise ValueError
    assert current_bus() is None


def test_import_is_cheap():
    code = (
        "import sys, composeai.events, composeai._streams; "
        "assert 'asyncio' not in sys.modules, 'asyncio imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- AGENT-90/91: RunStream ---------------------------------------------------


def test_run_stream_yields_events_then_stops_and_run_returns():
    run = fake_run(output=42)

    def call():
        # Emitted at once: the stream subscribed before the thread started.
        for i in range(5):
            emit(Event("text_delta", text=str(i)))
        return run

    stream = RunStream.start(call, cancellable=True)
    assert [ev.text for ev in stream] == ["0", "1", "2", "3", "4"]
    assert list(stream) == []  # iterating again after a full drain
    assert stream.run is run
    assert stream.run.output == 42


def test_run_stream_runs_on_a_daemon_thread_with_a_private_bus():
    outer = EventBus()
    outer_sub = outer.subscribe()
    seen = {}

    def call():
        seen["thread"] = threading.current_thread()
        seen["bus"] = current_bus()
        emit(Event("text_delta", text="inside"))
        return fake_run()

    with use_bus(outer):
        stream = RunStream.start(call, cancellable=False)
        assert [ev.text for ev in stream] == ["inside"]
    stream.run  # noqa: B018 -- join
    assert seen["thread"] is not threading.current_thread() and seen["thread"].daemon
    assert seen["bus"] is not None and seen["bus"] is not outer
    outer.close()
    assert list(outer_sub) == []  # nothing leaked to the caller's bus


def test_run_stream_reraises_the_same_exception_after_draining():
    boom = ValueError("boom")

    def call():
        emit(Event("text_delta", text="a"))
        emit(Event("text_delta", text="b"))
        raise boom

    stream = RunStream.start(call, cancellable=True)
    got = []
    with pytest.raises(ValueError) as info:
        for ev in stream:
            got.append(ev.text)
    assert info.value is boom
    assert got == ["a", "b"]
    assert list(stream) == []  # the drain is over: no second raise
    with pytest.raises(ValueError) as info2:
        stream.run  # noqa: B018
    assert info2.value is boom


def test_run_stream_run_reraises_without_iterating():
    boom = KeyError("k")

    def call():
        raise boom

    stream = RunStream.start(call, cancellable=True)
    with pytest.raises(KeyError) as info:
        stream.run  # noqa: B018
    assert info.value is boom


def test_run_stream_close_only_unsubscribes():
    release = threading.Event()
    finished = threading.Event()

    def call():
        emit(Event("text_delta", text="a"))
        release.wait(WAIT)
        emit(Event("text_delta", text="b"))
        finished.set()
        return fake_run(output="done")

    stream = RunStream.start(call, cancellable=True)
    assert next(stream).text == "a"
    thread, _, errors = in_thread(stream.close)  # any thread
    assert joined(thread) and not errors
    stream.close()  # idempotent
    release.set()
    assert list(stream) == []
    assert stream.run.output == "done" and finished.is_set()


def test_run_stream_close_from_another_thread_unblocks_iteration():
    release = threading.Event()

    def call():
        release.wait(WAIT)
        return fake_run()

    stream = RunStream.start(call, cancellable=True)
    consumer, results, errors = in_thread(list, stream)
    time.sleep(0.05)
    stream.close()
    assert joined(consumer) and not errors and results == [[]]
    release.set()
    assert stream.run.status == "completed"


# -- AGENT-93: cancellation token ---------------------------------------------


def test_cancel_token_is_ambient_in_the_call_and_cancel_is_idempotent():
    seen = {}

    def call():
        token = current_cancel_token()
        seen["token"] = token
        cancelled = token.wait(WAIT)  # the engine polls; waiting is also possible
        emit(Event("run_finished", data={"status": "cancelled"}))
        return fake_run(status="cancelled" if cancelled else "completed")

    assert current_cancel_token() is None
    stream = RunStream.start(call, cancellable=True)
    assert isinstance(stream.cancel_token, CancelToken)
    assert not stream.cancel_token.cancelled
    thread, _, errors = in_thread(stream.cancel)  # any thread
    assert joined(thread) and not errors
    stream.cancel()  # idempotent
    assert stream.cancel_token.cancelled
    assert [ev.data for ev in stream] == [{"status": "cancelled"}]
    assert stream.run.status == "cancelled"
    assert seen["token"] is stream.cancel_token
    assert current_cancel_token() is None  # never leaks into the caller


def test_cancel_before_the_call_looks_is_seen():
    gate = threading.Event()

    def call():
        gate.wait(WAIT)
        return fake_run(status="cancelled" if current_cancel_token().cancelled else "completed")

    stream = RunStream.start(call, cancellable=True)
    stream.cancel()
    gate.set()
    assert stream.run.status == "cancelled"


def test_cancel_on_a_non_cancellable_stream_is_accepted_and_ignored():
    gate = threading.Event()
    seen = {}

    def call():
        gate.wait(WAIT)
        seen["token"] = current_cancel_token()
        return fake_run()

    outer = CancelToken()
    with use_cancel_token(outer):
        stream = RunStream.start(call, cancellable=False)
    stream.cancel()
    gate.set()
    assert stream.run.status == "completed"
    assert not stream.cancel_token.cancelled
    # The stream's own token shadows any enclosing one.
    assert seen["token"] is stream.cancel_token is not outer


def test_use_cancel_token_nests_and_hides():
    token = CancelToken()
    with use_cancel_token(token) as t:
        assert t is token and current_cancel_token() is token
        with use_cancel_token(None):
            assert current_cancel_token() is None
        assert CANCEL_TOKEN.get() is token
    assert current_cancel_token() is None
    assert not token.wait(0)
    token.set()
    token.set()
    assert token.cancelled and token.wait(0)


# -- ASYNC-12: context propagation --------------------------------------------


def test_run_stream_call_sees_the_callers_contextvars():
    def call():
        return fake_run(output=CALLER_VAR.get())

    reset = CALLER_VAR.set("from caller")
    try:
        stream = RunStream.start(call, cancellable=True)
    finally:
        CALLER_VAR.reset(reset)
    assert stream.run.output == "from caller"


def test_run_stream_call_context_changes_do_not_leak_back():
    def call():
        CALLER_VAR.set("changed inside")
        return fake_run()

    RunStream.start(call, cancellable=True).run  # noqa: B018
    assert CALLER_VAR.get() == "unset"


# -- AGENT-92, ASYNC-4: AsyncRunStream ----------------------------------------


def test_async_run_stream_yields_events_and_run_returns():
    run = fake_run(output="ok")

    async def body():
        emit(Event("span_started", name="a"))
        await asyncio.sleep(0)
        # Events from a thread the body spawns reach the stream too.
        bus = current_bus()
        await asyncio.to_thread(bus.emit, Event("text_delta", text="from thread"))
        emit(Event("span_finished", name="a"))
        return run

    async def main():
        stream = AsyncRunStream.start(body)
        kinds = [ev.kind async for ev in stream]
        assert kinds == ["span_started", "text_delta", "span_finished"]
        assert [ev async for ev in stream] == []
        assert await stream.run() is run
        assert await stream.run() is run
        assert current_bus() is None

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_async_run_stream_reraises_the_same_exception():
    boom = RuntimeError("async boom")

    async def body():
        emit(Event("text_delta", text="a"))
        raise boom

    async def main():
        stream = AsyncRunStream.start(body)
        got = []
        with pytest.raises(RuntimeError) as info:
            async for ev in stream:
                got.append(ev.text)
        assert info.value is boom and got == ["a"]
        assert [ev async for ev in stream] == []
        with pytest.raises(RuntimeError) as info2:
            await stream.run()
        assert info2.value is boom

        stream2 = AsyncRunStream.start(body)
        with pytest.raises(RuntimeError) as info3:
            await stream2.run()
        assert info3.value is boom

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_async_run_stream_sees_callers_contextvars_and_no_cancel_token():
    async def body():
        return fake_run(output=(CALLER_VAR.get(), current_cancel_token()))

    async def main():
        CALLER_VAR.set("async caller")
        caller_token = CancelToken()
        with use_cancel_token(caller_token):
            stream = AsyncRunStream.start(body)
        run = await stream.run()
        value, token = run.output
        assert value == "async caller"
        # The caller's token never applies; the stream's own serves its
        # cancel() (EXT-10).
        assert token is not caller_token and not token.cancelled

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_async_run_stream_close_only_unsubscribes():
    async def main():
        release = asyncio.Event()

        async def body():
            emit(Event("text_delta", text="a"))
            await release.wait()
            emit(Event("text_delta", text="b"))
            return fake_run(output="done")

        stream = AsyncRunStream.start(body)
        assert (await stream.__anext__()).text == "a"
        stream.close()
        stream.close()
        release.set()
        assert [ev async for ev in stream] == []
        assert (await stream.run()).output == "done"

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_async_run_stream_needs_a_running_loop():
    async def body():
        return fake_run()

    with pytest.raises(RuntimeError):
        AsyncRunStream.start(body)


def test_async_run_stream_cancelling_run_cancels_the_task():
    async def main():
        started = asyncio.Event()

        async def body():
            started.set()
            await asyncio.sleep(WAIT)
            return fake_run()

        stream = AsyncRunStream.start(body)
        waiter = asyncio.create_task(stream.run())
        await started.wait()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        # The engine task was cancelled; draining ends promptly.
        with pytest.raises(asyncio.CancelledError):
            async for _ in stream:
                pass
        assert [ev async for ev in stream] == []

    asyncio.run(asyncio.wait_for(main(), WAIT))
