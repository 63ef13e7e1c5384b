#!/usr/bin/env python3
"""What ``nb.instrument`` adds to a model call, against the same call with the bare SDK, both
against the local server of the tests (tests/wire) in one process.

    python benchmarks/bench_instrument.py [--quick | --instructions] [--processes K]

A whole call (OpenAI Chat Completions, Anthropic Messages) is timed bare and instrumented,
interleaved call by call, in CPU time of the calling thread (the server's threads are not
counted) beside wall time; the instrumented call runs in a run with every axis armed (provider
calls, turns, tokens, output tokens, cost), so each reservation, clamp and charge happens. The
goal: at most 5% of the round trip, in CPU time. The comparison runs in K fresh processes (5 by
default), and the figure is their median: one process's figure moves by about a tenth from the
next's, the same code measured the same way (where its objects land in memory, and so which of
them miss the cache, changes from one process to the next), which is as large as the
differences being measured. A stream's per-chunk cost, instrumented less bare, is read through
an in-memory transport, in pairs of 1,000-chunk streams, in K fresh processes too: once as the
caller reads the chunks (the SDK parses each, about 90 us, between two of nbbudget's looks at
the bytes, so these run with cold caches; this is the figure the goal of at most 2 us a chunk
is about), and once as the bytes under the SDK's parser (``with_streaming_response``), where
the same work runs warm. Its figure is the median of every pair of every process: one
process's median moves by up to a microsecond from the next's.
"""

from __future__ import annotations

import argparse
import contextvars
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import anthropic
import httpx2
import openai
from wire import Server
from wire import anthropic_shapes as a
from wire import openai_shapes as o

import nbbudget as nb

ASK = [{"role": "user", "content": "plan the trip"}]
HUGE = 10**12


def compare(bare: Callable[[], object], instrumented: Callable[[], object], n: int,
            reps: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """CPU (this thread) and wall microseconds of one call of each, interleaved call by call
    (the order swapped at each), so that load from elsewhere hits both alike: the median over
    reps of each rep's median."""
    rows: list[list[tuple[float, float]]] = [[], []]
    for _ in range(reps):
        samples: list[list[tuple[int, int]]] = [[], []]
        gc.collect()
        gc.disable()
        try:
            for call in range(n):
                order = ((0, bare), (1, instrumented)) if call % 2 else (
                    (1, instrumented), (0, bare))
                for i, fn in order:
                    c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
                    fn()
                    samples[i].append((time.thread_time_ns() - c0, time.perf_counter_ns() - w0))
        finally:
            gc.enable()
        for i in (0, 1):
            rows[i].append((statistics.median(c for c, _ in samples[i]) / 1000,
                            statistics.median(w for _, w in samples[i]) / 1000))
    return tuple(  # type: ignore[return-value]
        (statistics.median(c for c, _ in row), statistics.median(w for _, w in row))
        for row in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under valgrind instead of timing")
    parser.add_argument("--processes", type=int, metavar="K",
                        help="fresh processes to compare whole calls and streams in "
                        "(5; --quick: 1)")
    parser.add_argument("--child", nargs=4, metavar=("URL", "API", "MODE", "N"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--calls", nargs=2, type=int, metavar=("N", "REPS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--chunks", type=int, metavar="PAIRS", help=argparse.SUPPRESS)
    parser.add_argument("--switch", nargs=2, type=int, metavar=("N", "REPS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    if args.calls:
        print(json.dumps(whole_calls(*args.calls)))
        return 0
    if args.chunks:
        print(json.dumps(per_chunk(args.chunks)))
        return 0
    if args.switch:
        print(json.dumps(switched(*args.switch)))
        return 0
    if args.instructions:
        return instructions()
    n, reps = (30, 3) if args.quick else (200, 5)
    processes = args.processes or (1 if args.quick else 5)
    if processes < 1:
        parser.error(f"--processes {processes}: give 1 or more")
    print(f"nb.instrument overhead: Python {sys.version.split()[0]}, {processes} processes of "
          f"{n} calls x {reps} reps, CPU time of the calling thread (wall beside)")
    figures: dict[str, list[list[float]]] = {}
    for k in range(processes):
        done = subprocess.run([sys.executable, __file__, "--calls", str(n), str(reps)],
                              capture_output=True, text=True, check=True)
        for name, row in json.loads(done.stdout).items():
            figures.setdefault(name, []).append(row)
            if name == RESERVATION:
                continue
            print(f"  process {k + 1}: {name:<20} added {row[2] - row[0]:5.1f} us CPU = "
                  f"{(row[2] - row[0]) / row[0]:6.1%}", flush=True)
    reserved = figures.pop(RESERVATION)
    for name, rows in figures.items():
        ratios = sorted((row[2] - row[0]) / row[0] for row in rows)
        middle = min(rows, key=lambda row: abs((row[2] - row[0]) / row[0]
                                               - statistics.median(ratios)))
        report(name, (middle[0], middle[1]), (middle[2], middle[3]))
        if len(rows) > 1:
            print(f"  {'':<20} over the {len(rows)} processes: {ratios[0]:.1%} to "
                  f"{ratios[-1]:.1%}")
    added = sorted(row[2] - row[0] for row in reserved)
    print(f"  the worst-case reservation (S3-10), cost_usd armed against not: added "
          f"{statistics.median(added):5.1f} us CPU a call, the median of {len(added)} "
          f"processes ({added[0]:.1f} to {added[-1]:.1f}; goal <= 10 us)")
    switch_n, switch_reps = (2000, 5) if args.quick else (20000, 9)
    print(f"The process-wide switch (nb.instrument()): {processes} processes; outside every "
          f"run, {switch_reps} reps of {switch_n} sends of each HTTP library's client through "
          f"an in-memory transport, switched and not, interleaved in blocks (and aiohttp's "
          f"middleware against a handler awaited directly); in a run, whole calls of a bare "
          f"client in blocks of 100, the switch on and off in turn (goals: at most 1 us added "
          f"outside a run, 5% in one)")
    rows: dict[str, list[list[float]]] = {}
    for k in range(processes):
        done = subprocess.run([sys.executable, __file__, "--switch", str(switch_n),
                               str(switch_reps)], capture_output=True, text=True, check=True)
        for name, row in json.loads(done.stdout).items():
            rows.setdefault(name, []).append(row)
            unit = "%" if name.startswith("in a run") else "us"
            added = (row[1] - row[0]) / row[0] * 100 if unit == "%" else row[1] - row[0]
            print(f"  process {k + 1}: {name:<44} bare {row[0]:8.2f} us, added "
                  f"{added:6.2f} {unit}", flush=True)
    for name, found in rows.items():
        if name.startswith("in a run"):
            ratios = sorted((r[1] - r[0]) / r[0] for r in found)
            print(f"  {name:<44} added {statistics.median(ratios):6.1%} of the round trip "
                  f"(goal <= 5%), the median of {len(found)} processes")
        else:
            added = sorted(r[1] - r[0] for r in found)
            print(f"  {name:<44} added {statistics.median(added):6.2f} us CPU a request "
                  f"(goal <= 1 us), the median of {len(found)} processes "
                  f"({added[0]:.2f} to {added[-1]:.2f})")
    pairs = 10 if args.quick else 60
    print(f"A streamed chat completion, per chunk: {processes} processes of {pairs} pairs of "
          f"1,000-chunk streams, CPU time (goal: at most 2 us added a chunk)")
    streams: dict[str, list[dict[str, Any]]] = {}
    for k in range(processes):
        done = subprocess.run([sys.executable, __file__, "--chunks", str(pairs)],
                              capture_output=True, text=True, check=True)
        for name, got in json.loads(done.stdout).items():
            streams.setdefault(name, []).append(got)
            q1, median, q3 = statistics.quantiles(got["added"], n=4)
            print(f"  process {k + 1}: {name:<32} bare {got['bare']:5.1f} us, added "
                  f"{median:5.2f} us (quartiles {q1:.2f} to {q3:.2f})", flush=True)
    for name, rows in streams.items():
        medians = sorted(statistics.median(got["added"]) for got in rows)
        pooled = [added for got in rows for added in got["added"]]
        print(f"  {name:<43} added {statistics.median(pooled):5.2f} us a chunk, the median "
              f"of all {len(pooled)} pairs"
              + (f" (the processes' medians: {medians[0]:.2f} to {medians[-1]:.2f})"
                 if len(rows) > 1 else ""))
    return 0


def whole_calls(n: int, reps: int) -> dict[str, list[float]]:
    """In this process: each API's whole call, bare and instrumented (`compare`), as
    [bare CPU, bare wall, instrumented CPU, instrumented wall] microseconds."""
    run = nb.budget(provider_calls=HUGE, turns=HUGE, tokens=HUGE, output_tokens=HUGE,
                    cost_usd=float(HUGE))
    out: dict[str, list[float]] = {}
    with Server() as server, run, \
            openai.OpenAI(base_url=server.url, api_key="k", max_retries=0) as bare_o, \
            anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as bare_a:
        inst_o, inst_a = nb.instrument(bare_o), nb.instrument(bare_a)
        server.default = o.chat("Paris.", o.chat_usage(20, 3, cached=5))

        def chat(client: openai.OpenAI) -> Callable[[], object]:
            return lambda: client.chat.completions.create(
                model="gpt-4o-mini", messages=ASK, max_completion_tokens=100)

        bare, inst = compare(chat(bare_o), chat(inst_o), n, reps)
        out["OpenAI chat"] = [*bare, *inst]
        server.default = a.message("Paris.", a.usage(20, 3))

        def message(client: anthropic.Anthropic) -> Callable[[], object]:
            return lambda: client.messages.create(
                model="claude-3-5-haiku-latest", messages=ASK,  # type: ignore[arg-type]
                max_tokens=100)

        bare, inst = compare(message(bare_a), message(inst_a), n, reps)
        out["Anthropic messages"] = [*bare, *inst]
        # S3-10: the same instrumented call in a run with every axis armed but cost, and in
        # this one, where it reserves its worst case first and its reply settles it
        server.default = o.chat("Paris.", o.chat_usage(20, 3, cached=5))
        armed = contextvars.copy_context()
        with nb.budget(provider_calls=HUGE, turns=HUGE, tokens=HUGE, output_tokens=HUGE):
            unarmed = contextvars.copy_context()
            call = chat(inst_o)
            without, with_ = compare(lambda: unarmed.run(call), lambda: armed.run(call), n, reps)
        out[RESERVATION] = [*without, *with_]
    return out


def switched(n: int, reps: int) -> dict[str, list[float]]:
    """In this process: what the process-wide switch adds. Outside every run, a ``send`` of each
    HTTP library's client through an in-memory transport (the request to a model endpoint, so
    that it is the path a model call takes), CPU microseconds a send with the switch off and
    on, in blocks of *n* interleaved (the switch turned on and off between blocks, outside the
    timing): [off, on], the median of *reps* blocks each. In a run with every axis armed, a
    whole OpenAI chat completion of a bare client against the loopback server, switch off and
    on, as `compare` times them: [off, on]."""
    import httpx

    from nbbudget.integrations.models import everywhere

    out: dict[str, list[float]] = {}
    body = json.dumps({"model": "gpt-4o-mini", "messages": ASK}).encode()
    for module in (httpx2, httpx):
        http = module.Client(transport=module.MockTransport(
            lambda request, module=module: module.Response(200, content=b"{}")))
        request = http.build_request("POST", "http://memory/v1/chat/completions", content=body)
        spent: dict[bool, list[float]] = {False: [], True: []}
        for rep in range(reps * 2):
            on = rep % 2 == 1
            switch = everywhere.install() if on else None
            gc.collect()
            gc.disable()
            try:
                start = time.thread_time_ns()
                for _ in range(n):
                    http.send(request)
                spent[on].append((time.thread_time_ns() - start) / 1000 / n)
            finally:
                gc.enable()
                if switch is not None:
                    switch.undo()
        http.close()
        out[f"outside every run, {module.__name__}.Client.send"] = [
            statistics.median(spent[False]), statistics.median(spent[True])]
    out["outside every run, aiohttp's middleware"] = _middleware_outside(n, reps)
    out["outside every run, botocore's two methods"] = _botocore_outside(n, reps)
    run = nb.budget(provider_calls=HUGE, turns=HUGE, tokens=HUGE, output_tokens=HUGE,
                    cost_usd=float(HUGE))
    with Server() as server, run, \
            openai.OpenAI(base_url=server.url, api_key="k", max_retries=0) as bare:
        server.default = o.chat("Paris.", o.chat_usage(20, 3, cached=5))

        def call() -> object:
            return bare.chat.completions.create(model="gpt-4o-mini", messages=ASK,
                                                max_completion_tokens=100)

        # in blocks of 100 calls, the switch on and off in turn between blocks (outside the
        # timing): turning it on or off replaces a method on the HTTP library's classes, which
        # costs the next calls the interpreter's specialised lookups on them, so it is done
        # once a block, not between two calls. The median of each state's block medians, in
        # CPU time of this thread
        medians: dict[bool, list[float]] = {False: [], True: []}
        for rep in range(reps * 2):
            on = rep % 2 == 1
            switch = everywhere.install() if on else None
            try:
                for _ in range(5):  # the lookups specialised again, before the timing
                    call()
                samples: list[int] = []
                gc.collect()
                gc.disable()
                try:
                    for _ in range(100):
                        start = time.thread_time_ns()
                        call()
                        samples.append(time.thread_time_ns() - start)
                finally:
                    gc.enable()
            finally:
                if switch is not None:
                    switch.undo()
            medians[on].append(statistics.median(samples) / 1000)
        out["in a run, a bare OpenAI client's whole call"] = [statistics.median(medians[False]),
                                                              statistics.median(medians[True])]
    return out


def _middleware_outside(n: int, reps: int) -> list[float]:
    """Outside every run, what the switch's aiohttp middleware adds to a request: CPU
    microseconds of awaiting the next handler (one that answers at once) directly and through
    the middleware, in blocks of *n* interleaved: [direct, through], the median of *reps*."""
    import asyncio

    from nbbudget.integrations.models import aio

    middleware = aio.middleware(lambda request, library: None)
    request = object()  # outside every run the middleware hands it on unread

    async def handler(request: object) -> object:
        return request

    async def blocks() -> list[float]:
        spent: dict[bool, list[float]] = {False: [], True: []}
        for rep in range(reps * 2):
            through = rep % 2 == 1
            gc.collect()
            gc.disable()
            try:
                start = time.thread_time_ns()
                if through:
                    for _ in range(n):
                        await middleware(request, handler)  # type: ignore[arg-type]
                else:
                    for _ in range(n):
                        await handler(request)
                spent[through].append((time.thread_time_ns() - start) / 1000 / n)
            finally:
                gc.enable()
        return [statistics.median(spent[False]), statistics.median(spent[True])]

    return asyncio.run(blocks())


def _botocore_outside(n: int, reps: int) -> list[float]:
    """Outside every run, what the switch adds to each attempt of a boto3 call: CPU
    microseconds of botocore's ``Endpoint.create_request`` and ``URLLib3Session.send`` (each
    replaced here by one that answers at once, so that only the switch's work around them is
    timed) called directly and through the switch's replacements, in blocks of *n*
    interleaved: [direct, through], the median of *reps*."""
    from botocore.awsrequest import AWSPreparedRequest

    from nbbudget.integrations.models import boto

    def create_request(self: object, params: object, operation_model: object = None) -> object:
        return params

    def send(self: object, request: object) -> object:
        return request

    through_create = boto.switched_create_request(create_request, lambda *args: None)
    through_send = boto.switched_send(send)
    request = AWSPreparedRequest("POST", "http://memory/model/m/converse", {}, b"{}", False,
                                 {"client_config": None})
    params = {"url": "http://memory/model/m/converse", "context": request.context}
    spent: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(reps * 2):
        through = rep % 2 == 1
        made, sent = (through_create, through_send) if through else (create_request, send)
        gc.collect()
        gc.disable()
        try:
            start = time.thread_time_ns()
            for _ in range(n):
                made(None, params, "op")
                sent(None, request)
            spent[through].append((time.thread_time_ns() - start) / 1000 / n)
        finally:
            gc.enable()
    return [statistics.median(spent[False]), statistics.median(spent[True])]


#: the row of `whole_calls` that compares a call with cost_usd unarmed and armed
RESERVATION = "reservation"


#: the two ways a stream is read in `per_chunk`
CALLER_READS = "chunks as the caller reads them"
BYTES_READ = "bytes under the SDK's parser"


def per_chunk(pairs: int) -> dict[str, dict[str, Any]]:
    """In this process: a streamed chat completion's cost per chunk, bare and instrumented,
    with the SDK reading from an in-memory transport (httpx2.MockTransport: the events of
    tests/wire, one chunk an event, no socket), so that the figure is not lost in the noise of
    the network stack: a stream of 1,000 chunks each way, in pairs; for each way of reading,
    the difference of each pair and the bare median, microseconds a chunk (the per-call cost,
    spread over 1,000 chunks, included). The server's bytes are made once, before the timing:
    the instrumented request asks for usage, which makes every event longer to write, and that
    is the server's work, not the caller's."""
    chunks = 1000
    reply = o.chat_stream(["tok "] * chunks, o.chat_usage(20, chunks))
    written = {asked: reply.written({"stream_options": {"include_usage": True}} if asked else {})
               for asked in (False, True)}

    def handler(request: httpx2.Request) -> httpx2.Response:
        options = json.loads(request.content).get("stream_options") or {}
        return httpx2.Response(200, headers={"content-type": "text/event-stream"},
                               content=iter(written[bool(options.get("include_usage"))]))

    run = nb.budget(provider_calls=HUGE, turns=HUGE, tokens=HUGE, output_tokens=HUGE,
                    cost_usd=float(HUGE))
    out = {}
    with run, httpx2.Client(transport=httpx2.MockTransport(handler)) as http, \
            openai.OpenAI(base_url="http://memory", api_key="k", http_client=http) as bare:
        inst = nb.instrument(bare)

        def chunks_read(client: openai.OpenAI) -> int:
            return sum(1 for _ in client.chat.completions.create(
                model="gpt-4o-mini", messages=ASK, stream=True))  # type: ignore[arg-type]

        def bytes_read(client: openai.OpenAI) -> int:
            with client.chat.completions.with_streaming_response.create(
                    model="gpt-4o-mini", messages=ASK,  # type: ignore[arg-type]
                    stream=True) as response:
                return sum(1 for _ in response.iter_bytes())

        for name, read in ((CALLER_READS, chunks_read), (BYTES_READ, bytes_read)):
            added, bare_us = paired(read, bare, inst, pairs, chunks)
            out[name] = {"added": added, "bare": statistics.median(bare_us)}
    return out


def paired(read: Callable[[openai.OpenAI], int], bare: openai.OpenAI, inst: openai.OpenAI,
           pairs: int, chunks: int) -> tuple[list[float], list[float]]:
    """CPU per chunk of *read* with each client, in pairs, the order swapped at each pair: the
    instrumented less the bare, and the bare."""
    read(bare), read(inst)  # warm
    added, bare_us = [], []
    gc.collect()
    gc.disable()
    try:
        for pair in range(pairs):
            spent = {}
            for client in ((bare, inst) if pair % 2 else (inst, bare)):
                start = time.thread_time_ns()
                read(client)
                spent[id(client)] = (time.thread_time_ns() - start) / 1000 / chunks
            added.append(spent[id(inst)] - spent[id(bare)])
            bare_us.append(spent[id(bare)])
    finally:
        gc.enable()
    return added, bare_us


def instructions() -> int:
    """The same comparisons in instructions, counted by valgrind's callgrind in a process that
    makes the calls (the server runs here, outside valgrind): a count is the same whatever
    else the machine is doing, where CPU time on a shared machine swings by more than the
    figure. Each client makes a few calls, then many more; the difference over the calls
    between is one call's instructions, with start-up and the first call's caches left out.
    The four processes of each API run two at a time (about ten minutes in all).

    The count still moves between versions of the package: the bare call's count, in which
    nbbudget runs none of its code, has been seen to differ by 4% from one version to the
    next (the cause is not known); read the added count, bare and instrumented counted in
    the same version, rather than comparing bare counts across versions."""
    few, many = 5, 35
    print(f"nb.instrument overhead in instructions: Python {sys.version.split()[0]}, "
          f"callgrind, {many} - {few} calls")
    with Server() as server:
        for api, reply, name in (("chat", o.chat("Paris.", o.chat_usage(20, 3, cached=5)),
                                  "OpenAI chat"),
                                 ("messages", a.message("Paris.", a.usage(20, 3)),
                                  "Anthropic messages"),
                                 ("stream", o.chat_stream(["tok "] * 200, o.chat_usage(20, 200)),
                                  "OpenAI chat stream of 200 chunks")):
            server.default = reply
            jobs = [(mode, n) for mode in ("bare", "instrumented") for n in (few, many)]
            with ThreadPoolExecutor(2, thread_name_prefix="bench-callgrind") as pool:
                counts = dict(zip(jobs, pool.map(
                    _callgrind, [server.url] * 4, [api] * 4, *zip(*jobs, strict=True)),
                    strict=True))
            per_call = {mode: (counts[mode, many] - counts[mode, few]) / (many - few)
                        for mode in ("bare", "instrumented")}
            added = per_call["instrumented"] - per_call["bare"]
            print(f"  {name:<34} bare {per_call['bare'] / 1e6:6.2f} M instructions a call, "
                  f"added {added / 1e3:7.1f} k = {added / per_call['bare']:6.1%}"
                  + (f" ({added / 200:.0f} a chunk)" if api == "stream" else ""))
    return 0


def _callgrind(url: str, api: str, mode: str, n: int) -> int:
    """The instructions of a process that makes *n* calls of *api* with the *mode* client."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         __file__, "--child", url, api, mode, str(n)],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"})  # the same dicts and sets in every process
    found = re.search(r"Collected : (\d+)", done.stderr)
    assert found is not None, done.stderr
    return int(found.group(1))


def child(url: str, api: str, mode: str, n: str) -> int:
    """In the counted process: *n* calls of *api* (chat, messages, stream) in a run with every
    axis armed, with the bare client or the instrumented one. The cyclic garbage collector is
    off, as in the timed comparisons: a collection falls in one count and not in the other."""
    gc.collect()
    gc.disable()
    run = nb.budget(provider_calls=HUGE, turns=HUGE, tokens=HUGE, output_tokens=HUGE,
                    cost_usd=float(HUGE))
    with run:
        if api == "messages":
            client_a = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
            use_a = nb.instrument(client_a) if mode == "instrumented" else client_a
            for _ in range(int(n)):
                use_a.messages.create(model="claude-3-5-haiku-latest", messages=ASK,  # type: ignore[arg-type]
                                      max_tokens=100)
            return 0
        client_o = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
        use_o = nb.instrument(client_o) if mode == "instrumented" else client_o
        for _ in range(int(n)):
            if api == "stream":
                for _chunk in use_o.chat.completions.create(
                        model="gpt-4o-mini", messages=ASK, stream=True):  # type: ignore[arg-type]
                    pass
            else:
                use_o.chat.completions.create(model="gpt-4o-mini", messages=ASK,  # type: ignore[arg-type]
                                              max_completion_tokens=100)
    return 0


def report(name: str, bare: tuple[float, float], inst: tuple[float, float]) -> None:
    added = inst[0] - bare[0]
    print(f"  {name:<20} bare {bare[0]:7.0f} us CPU ({bare[1]:6.0f} us wall), instrumented "
          f"{inst[0]:7.0f} us CPU ({inst[1]:6.0f} us wall): added {added:5.0f} us CPU = "
          f"{added / bare[0]:6.1%} of the round trip (goal <= 5%)")


if __name__ == "__main__":
    sys.exit(main())
