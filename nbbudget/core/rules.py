"""The rules of the model, each with an id (``S0-10``), as ``nbbudget explain ID`` prints them
and as the documentation's Concepts page shows them.

Error messages cite a rule as ``(see: nbbudget explain S0-10)``; each entry here holds the rule's
title, its text (Markdown: links are reduced to their text in a terminal), a short example that
runs as written, what that example prints, and its anchor in the documentation
(``concepts.html#s0-10``). The ids group the rules by where they come from: ``S0`` the call
budget, ``S2`` grants and cancellation, ``S3`` task limits, ``S4`` run limits, ``N`` notebooks.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from textwrap import dedent

__all__ = ["DOCS_PAGE", "RULES", "Rule", "explain", "find", "index", "see"]

#: the page of the documentation that explains every rule, one section each
DOCS_PAGE = "concepts"

_LINK = re.compile(r"\[([^\]]+)\]\([^)\s]+\)")


@dataclass(frozen=True)
class Rule:
    """One rule of the model.

    ``language`` is ``"python"`` for an example that runs in plain Python, ``"ipython"`` for a
    notebook cell that runs once ``%load_ext nbbudget`` has run. ``output`` is what a Python
    example prints, exactly.
    """

    id: str
    title: str
    text: str
    example: str
    output: str = ""
    language: str = "python"

    @property
    def anchor(self) -> str:
        """The rule's target in the documentation: ``s0-10``."""
        return self.id.lower()

    @property
    def group(self) -> str:
        """``S0``, ``S2``, ``S3``, ``S4`` or ``N``."""
        return self.id.partition("-")[0]

    def plain_text(self) -> str:
        """The text for a terminal: each Markdown link reduced to its words."""
        return _LINK.sub(r"\1", self.text)


def see(rule_id: str) -> str:
    """How a message cites a rule: ``(see: nbbudget explain S0-10)``."""
    return f"(see: nbbudget explain {find(rule_id).id})"


def find(rule_id: str) -> Rule:
    """The rule with this id, whatever its case; a `LookupError` naming the known ids if none."""
    wanted = rule_id.strip().upper()
    for rule in RULES:
        if rule.id == wanted:
            return rule
    raise LookupError(f"no rule {rule_id!r}; the rules are {', '.join(r.id for r in RULES)}")


def explain(rule: Rule, width: int = 88) -> str:
    """The rule for a terminal: its title, its text, its example, what that prints, and where
    the documentation explains it."""
    paragraphs = [textwrap.fill(" ".join(p.split()), width)
                  for p in rule.plain_text().split("\n\n")]
    where = ("Example, a notebook cell once %load_ext nbbudget has run:"
             if rule.language == "ipython" else "Example:")
    parts = [f"{rule.id}: {rule.title}", *paragraphs, where, _indent(rule.example)]
    if rule.output:
        parts += ["It prints:", _indent(rule.output)]
    parts.append(f"Read more: docs/{DOCS_PAGE}.md#{rule.anchor} "
                 f"(the Concepts page of the documentation)")
    return "\n\n".join(parts)


def index() -> str:
    """Every rule's id and title, one a line."""
    rows = [f"  {rule.id:<7}{rule.title}" for rule in RULES]
    return "\n".join(["The rules of the model; nbbudget explain ID shows one with an example:",
                      *rows])


def _indent(block: str) -> str:
    return textwrap.indent(block, "    ")


def _rule(rule_id: str, title: str, text: str, example: str, output: str = "",
          language: str = "python") -> Rule:
    """A rule written as indented triple-quoted blocks, dedented; the output keeps its spaces."""
    return Rule(rule_id, title, dedent(text).strip(), dedent(example).strip(),
                dedent(output).strip("\n"), language)


_S0 = (
    _rule(
        "S0-1", "a call that may stop early answers within its budget",
        """
        A call that declares interruption (`detach=True` or `resume=True`, or the `--detach` and
        `--resume` flags) returns to a non-interactive caller within its call budget: with its
        result if the work finished, otherwise with INCOMPLETE (exit code 14). A `detach` call
        answers as the budget runs out. A `resume` call answers at the first checkpoint after the
        budget ran out, so it may answer a little late when checkpoints are far apart.
        """,
        """
        import time
        import nbbudget as nb

        def crunch(n):
            for i in range(nb.resume_state(0), n):
                time.sleep(0.05)                # a piece of work
                nb.checkpoint(i + 1)            # where the work may pause
            return "done"

        response = nb.call(crunch, 100, resume=True, budget="500ms")
        print(response.exit_code, response.data["state"])
        """,
        """
        14 paused
        """,
    ),
    _rule(
        "S0-2", "running out of budget never discards work",
        """
        With `detach`, the work goes on as a background job (`nb.jobs`). With `resume`, the work
        stops at its next `nb.checkpoint(state)`, and that state is saved durably in the store
        before the caller is answered.
        """,
        """
        import time
        import nbbudget as nb

        def train():
            time.sleep(1)
            return "model"

        response = nb.call(train, detach=True, budget="200ms")
        print(response.data["state"])                   # the caller is free...
        print(nb.jobs[response.data["job"]].result())   # ...and the work went on
        """,
        """
        running
        model
        """,
    ),
    _rule(
        "S0-3", "where the call budget comes from",
        """
        The budget is, in this order: the `--budget` flag (or `budget=` argument); else the
        environment variable `AGENT_CALL_BUDGET_MS`, read under exactly that name at each call;
        else 30000 ms. In a kernel, the setting `NBBudget.default_budget_ms` replaces the
        30000 ms default.
        """,
        """
        import os
        import nbbudget as nb

        def total(numbers):
            return sum(numbers)

        os.environ["NBBUDGET_INTERACTIVE"] = "0"        # a program is calling
        os.environ["AGENT_CALL_BUDGET_MS"] = "500"
        print(nb.call(total, [1, 2], detach=True, budget="2s").meta["budget_ms"])
        print(nb.call(total, [1, 2], detach=True).meta["budget_ms"])
        del os.environ["AGENT_CALL_BUDGET_MS"]
        print(nb.call(total, [1, 2], detach=True).meta["budget_ms"])
        """,
        """
        2000
        500
        30000
        """,
    ),
    _rule(
        "S0-4", "a budget of 0 turns it off",
        """
        `--budget 0` (or `budget=0`) means the caller waits until the work ends or its wall-clock
        limit fires. The response still says which budget was in force: `meta.budget_ms` is `0`.
        """,
        """
        import time
        import nbbudget as nb

        def train():
            time.sleep(0.5)
            return "model"

        response = nb.call(train, detach=True, budget=0)
        print(response.data, response.meta["budget_ms"])
        """,
        """
        model 0
        """,
    ),
    _rule(
        "S0-5", "a person gets no default budget",
        """
        When a person runs the call interactively, the budget applies only if they give
        `--budget` themselves; otherwise the call runs to its end as a plain call would, and
        `meta.budget_ms` is absent. nbbudget decides who is calling as described in
        [N-1](#n-1).
        """,
        """
        import os
        import nbbudget as nb

        def total(numbers):
            return sum(numbers)

        os.environ["NBBUDGET_INTERACTIVE"] = "1"        # a person is calling
        os.environ["AGENT_CALL_BUDGET_MS"] = "500"      # ignored for a person
        response = nb.call(total, [1, 2], detach=True)
        print(response.data, "budget_ms" in response.meta)
        """,
        """
        3 False
        """,
    ),
    _rule(
        "S0-6", "the budget bounds one call, the wall clock bounds the work",
        """
        `--budget` bounds a single call. `--timeout` bounds the whole work, counted from its first
        start: continuing a paused call or reattaching to a job does not give it a fresh timeout.
        """,
        """
        import time
        import nbbudget as nb

        def copy_files(n):
            for i in range(nb.resume_state(0), n):
                time.sleep(0.05)
                nb.checkpoint(i + 1)
            return "done"

        first = nb.call(copy_files, 100, resume=True, budget="300ms", timeout="1s")
        print(first.data["state"])                      # the second starts now
        time.sleep(1)                                   # the second runs out between calls
        later = nb.call(copy_files, 100, resume=True, budget="300ms", timeout="1s")
        print(later.exit_code, later.error["code"])     # no fresh timeout: cancelled
        """,
        """
        paused
        124 cancelled
        """,
    ),
    _rule(
        "S0-7", "a call may hand off early",
        """
        A call that knows from a cheap estimate that it cannot finish within its budget need not
        wait for the budget to run out: `nb.call(..., estimate_ms=...)` with an estimate larger
        than the budget detaches at once (or pauses at its first checkpoint).
        """,
        """
        import time
        import nbbudget as nb

        def build_index():
            time.sleep(0.5)
            return "model"

        response = nb.call(build_index, detach=True, budget="2s", estimate_ms="5m")
        print(response.data["state"], response.meta["duration_ms"] < 100)   # at once
        print(nb.jobs[response.data["job"]].result())
        """,
        """
        running True
        model
        """,
    ),
    _rule(
        "S0-8", "every answer says which budget was in force",
        """
        Every response of a call that declares interruption carries `meta.budget_ms`, the budget
        in force for that call, whatever its outcome. The one exception is [S0-5](#s0-5): a person
        who gave no budget has none, so the field is absent.
        """,
        """
        import nbbudget as nb

        def divide(a, b):
            return a / b

        done = nb.call(divide, 1, 2, detach=True, budget="1s")
        failed = nb.call(divide, 1, 0, detach=True, budget="1s")
        print(done.meta["budget_ms"], failed.meta["budget_ms"], failed.error["code"])
        """,
        """
        1000 1000 ZeroDivisionError
        """,
    ),
    _rule(
        "S0-9", "work that finishes in time answers normally",
        """
        When the work ends within the budget, the response is its ordinary one: `ok` true and the
        result in `data` (or the work's own error), with its own exit code, plus `meta.budget_ms`.
        """,
        """
        import nbbudget as nb

        def total(numbers):
            return sum(numbers)

        response = nb.call(total, [1, 2, 3], resume=True, budget="2s")
        print(response.ok, response.data, response.exit_code, response.meta["budget_ms"])
        """,
        """
        True 6 0 2000
        """,
    ),
    _rule(
        "S0-10", "no budget without a way to stop early",
        """
        A call that declares neither `detach` nor `resume` cannot return before its work ends, so
        it has no call budget: asking for one is a usage error, `AGENT_CALL_BUDGET_MS` is ignored,
        and its wall-clock limit (`timeout=`) still applies.
        """,
        """
        import nbbudget as nb

        def total(numbers):
            return sum(numbers)

        try:
            nb.call(total, [1, 2, 3], budget="2s")
        except nb.ConfigError as err:
            print(err)
        """,
        """
        budget='2s' needs detach=True or resume=True: only a call that can detach or pause can return before its work ends; drop budget= or declare one of them (see: nbbudget explain S0-10)
        """,  # noqa: E501 - the output as printed, one line
    ),
    _rule(
        "S0-11", "the identical call continues the work",
        """
        Making the identical call again continues the same work instead of starting over.
        "Identical" means the same work: the same cell source with the same flags (`--budget` and
        `--timeout` aside), the same function with the same arguments, or the same `key=`
        (`--key`). After a `resume` INCOMPLETE it continues from the saved checkpoint; after a
        `detach` INCOMPLETE it reattaches to the running job and returns its result once done, or
        INCOMPLETE again (state `running`) if the budget runs out first. Once a call has delivered
        the final result, the work is complete, and the next identical call starts it anew.
        """,
        """
        import time
        import nbbudget as nb

        def count(n):
            start = nb.resume_state(0)
            for i in range(start, n):
                time.sleep(0.03)
                nb.checkpoint(i + 1)
            return start                                # where this call took over

        print(nb.call(count, 20, resume=True, budget="200ms").data["state"])
        print(nb.call(count, 20, resume=True, budget=0).data > 0)    # continued
        print(nb.call(count, 20, resume=True, budget=0).data)        # done: starts anew
        """,
        """
        paused
        True
        0
        """,
    ),
    _rule(
        "S0-12", "the response envelope",
        """
        Every call answers with the same envelope, `nb.Response`: `{"ok", "data", "error",
        "warnings", "meta"}`. An INCOMPLETE response has `ok` false, `meta.exit_code` 14,
        `data.state` `running` (detach; `starting` while the cluster it names by its address is
        still being connected to) or `paused` (resume), `data.job` or `data.checkpoint`, and a
        one-line `data.next` that tells the caller how to continue. `meta` also holds
        `duration_ms`, `budget_ms` and, when a wall-clock limit is set, `timeout_ms`. A failure
        has `error` set to `{"code": ..., "message": ...}`.
        """,
        """
        import json
        import time
        import nbbudget as nb

        def render_report():
            time.sleep(0.5)
            return "model"

        envelope = json.loads(nb.call(render_report, detach=True, budget="100ms").to_json())
        print(sorted(envelope), envelope["ok"], sorted(envelope["data"]))
        print(sorted(envelope["meta"]), envelope["meta"]["exit_code"])
        print(nb.jobs[envelope["data"]["job"]].result())
        """,
        """
        ['data', 'error', 'meta', 'ok', 'warnings'] False ['job', 'next', 'state']
        ['budget_ms', 'duration_ms', 'exit_code'] 14
        model
        """,
    ),
)

_S2 = (
    _rule(
        "S2-1", "a child's deadline never outlives its caller's",
        """
        A grant's effective deadline is the smaller of its own time grant and its caller's
        remaining time.
        """,
        """
        import nbbudget as nb
        from nbbudget.testing import FakeClock

        clock = FakeClock()                             # moves only when told to
        with nb.budget(time="10s", clock=clock) as run:
            clock.advance("7s")
            with run.grant(time="5s") as child:
                print(child.remaining_ms)               # the run has only 3 s left
        """,
        """
        3000.0
        """,
    ),
    _rule(
        "S2-2", "a child's step grant is its own",
        """
        Steps taken by a child count against the child's own allowance, not against its parent
        *grant's* allowance. Run-wide limits still count everything ([S4-3](#s4-3)).
        """,
        """
        import nbbudget as nb

        with nb.budget(steps=10) as run:
            with run.grant(steps=2) as child:
                child.step()
                child.step()
                try:
                    child.step()
                except nb.BudgetExceeded as refused:
                    print(refused)
            print(run.consumed["steps"])                # the run counted the child's steps
        """,
        """
        steps would exceed this grant's limit of 2 (2 used, 1 more requested); raise the limit or do less work
        2
        """,  # noqa: E501 - the output as printed, one line
    ),
    _rule(
        "S2-3", "cancellation reaches every descendant",
        """
        Cancelling a run stops every grant and sub-agent inside it. A stopped child is reported
        to its caller as `stopped` and is never retried. `cancel()` is idempotent and safe from
        any thread, and every later check raises again.

        A cancel is a request: Python cannot stop a thread from outside, so the work stops at
        its next budget check (`step()`, `charge()`, `check()`, a tool call, `nb.checkpoint`).
        The trace keeps both moments: `cancel_requested` when `cancel()` is called,
        `cancel_observed` when the work first reaches a check after it. A background job stays
        `running` (`job.cancel_status == "requested"`) until its work ends, then settles
        `cancelled` (`"stopped"`) or, when the work ended without reaching a check, `done` or
        `failed` with its result or error kept (`"not honoured"`); `%budget cancel ID` says
        which.
        """,
        """
        import nbbudget as nb

        try:
            with nb.budget() as run:
                with run.grant(name="child") as child:
                    run.cancel("enough")
                    child.check()
        except nb.Cancelled as stop:
            print(stop)
        print(run.outcome.status, child.outcome.status)
        """,
        """
        run was stopped: enough
        stopped stopped
        """,
    ),
    _rule(
        "S2-4", "how a stop settles",
        """
        A stop by a person (`run.cancel()`, the Stop button, a kernel interrupt) settles as
        `stopped`. Exhausting a grant settles as `failed` with cause `budget-cut`, and the cut
        names its cause in `by`: `timeout` (time ran out), `watchdog` (silent work),
        `stream-error` (a model stream failed after sending content), or the kind of the limit
        that ran out (`steps`, `tokens`, ...).
        """,
        """
        import nbbudget as nb
        from nbbudget.testing import FakeClock

        clock = FakeClock()
        try:
            with nb.budget(time="5s", clock=clock) as run:
                clock.advance("6s")
                run.check()
        except nb.BudgetCut as cut:
            print(cut.by)
        print(run.outcome.status, run.outcome.cause, run.outcome.by)
        """,
        """
        timeout
        failed budget-cut timeout
        """,
    ),
    _rule(
        "S2-5", "the watchdog cuts silent work",
        """
        Work that declares how long it may stay silent (`max_silence`) and stays silent longer has
        its signal set and is cut `by="watchdog"`. `ctx.progress(data)` is the heartbeat: it
        records a `progress` event and restarts the silence window.
        """,
        """
        import time
        import nbbudget as nb

        with nb.budget(tool_calls=10, time="1m") as run:
            @run.tool(max_silence="300ms")
            def fetch(chunks, ctx):
                for i in range(chunks):
                    time.sleep(0.1)
                    ctx.progress({"chunk": i})          # the heartbeat
                ctx.signal.wait(5)                      # then silence, until the cut

            try:
                fetch(5)
            except nb.BudgetCut as cut:
                print(cut.by)
        """,
        """
        watchdog
        """,
    ),
    _rule(
        "S2-6", "the run's time caps every tool call",
        """
        A tool call never runs past the run's remaining time, whether or not it declares
        `max_silence`.
        """,
        """
        import nbbudget as nb

        try:
            with nb.budget(time="300ms") as run:
                @run.tool
                def wait(ctx):
                    ctx.signal.wait(5)                  # ends early when the tool is cut

                wait()
        except nb.BudgetCut as cut:
            print(cut.by, run.outcome.status)
        """,
        """
        timeout failed
        """,
    ),
    _rule(
        "S2-7", "a cut frees the caller",
        """
        When a tool call is cut, its caller gets `nb.BudgetCut` at once, even if the tool ignores
        its signal. Python cannot kill a thread, so such a tool is *abandoned*: it runs on, the
        trace records a `tool_abandoned` event naming its thread, and it stops at its next `ctx`
        call. Well-behaved tools watch `ctx.signal` or call `ctx.check()`. See
        [Limits](limits.md).
        """,
        """
        import time
        import nbbudget as nb

        started = time.monotonic()
        try:
            with nb.budget(time="200ms") as run:
                @run.tool
                def stubborn():
                    time.sleep(1)                       # ignores every signal

                stubborn()
        except nb.BudgetCut as cut:
            print(cut.by, time.monotonic() - started < 0.9)      # freed before the tool ended
        print([event.kind for event in run.trace.events if event.kind == "tool_abandoned"])
        """,
        """
        timeout True
        ['tool_abandoned']
        """,
    ),
    _rule(
        "S2-8", "a manifest declares the runtime's ceilings",
        """
        A manifest file may declare two ceilings of the runtime that runs the notebook:
        `turn.wallClock` (how long one turn may take, optionally with `under`, a platform limit it
        must stay below) and `transport.envelopeBytes` (the largest response, in UTF-8 bytes). A
        manifest that declares one must declare both. A missing entry, or a wall clock not below
        `under`, is refused when the manifest is loaded. A response larger than `envelopeBytes`
        is truncated with a warning; it is never sent whole.
        """,
        """
        import nbbudget as nb

        manifest = {"manifest_version": "nbbudget-manifest-v1",     # a manifest file's content
                    "run_limits": {"max_steps": 500, "tool_calls": 40},
                    "turn": {"wallClock": 60000, "under": 90000}}
        try:
            nb.Manifest.from_mapping(manifest)
        except nb.ConfigError as err:
            print(err)
        manifest["transport"] = {"envelopeBytes": 65536}
        print(nb.Manifest.from_mapping(manifest))
        """,
        """
        the manifest declares one runtime ceiling but not transport.envelopeBytes; declare both turn.wallClock and transport.envelopeBytes, or neither
        Manifest(limits=Limits(steps=500, tool_calls=40), wall_clock_ms=60000, under_ms=90000, envelope_bytes=65536, path=None)
        """,  # noqa: E501 - the output as printed, one line
    ),
    _rule(
        "S2-9", "an output-token grant is cumulative",
        """
        `output_tokens` is an allowance for the whole run. Before each model request, the
        request's output reserve (`max_output_tokens`) is clamped to what remains of it. When the
        allowance is spent the run fails `budget-cut`; nbbudget never makes up a completion.
        """,
        """
        import nbbudget as nb
        from nbbudget.testing import Reply, ScriptedProvider

        model = ScriptedProvider([Reply("draft", output_tokens=300),
                                  Reply("final", output_tokens=100)])
        with nb.budget(output_tokens=400) as run:
            ask = run.provider(model)
            ask("write a draft", max_output_tokens=1000)
            ask("finish it", max_output_tokens=1000)
        print(model.calls)                              # each cap is what remained
        """,
        """
        [('write a draft', 400), ('finish it', 100)]
        """,
    ),
)

_S3 = (
    _rule(
        "S3-1", "tokens, cost and time may be windows",
        """
        With `suspend=True`, the `tokens`, `cost_usd` and `run_ms` limits are per-slice
        *windows*: a spent window suspends the run (outcome `suspended`) instead of failing it,
        and `nb.Budget.resume(run.state())` continues with a fresh window of the same size.
        Whole-run totals (`totals=`) are frozen in the saved state: no resume refreshes them.
        """,
        """
        import nbbudget as nb

        with nb.budget(tokens=1000, suspend=True, totals=nb.Limits(tokens=2500)) as run:
            run.charge("tokens", 600)
            run.charge("tokens", 600)                   # the window is spent: the run suspends
        print(run.outcome.status, run.outcome.by)
        with nb.Budget.resume(run.state()) as later:
            later.charge("tokens", 900)                 # a fresh window of 1000
            print(later.consumed["tokens"])
        """,
        """
        suspended tokens
        1500
        """,
    ),
    _rule(
        "S3-2", "without windows, a spent limit is a loud failure",
        """
        Without `suspend`, an exhausted limit ends the run as `failed`, with the limit's error code
        (for example `StepBudgetExceeded`) and whatever output the run had produced so far
        (`run.set_output(...)`, then `run.outcome.output`).
        """,
        """
        import nbbudget as nb

        rows = []
        try:
            with nb.budget(steps=2) as run:
                for i in range(5):
                    run.step()
                    rows.append(i)
                    run.set_output(list(rows))
        except nb.BudgetExceeded:
            pass
        print(run.outcome.status, run.outcome.code, run.outcome.output)
        """,
        """
        failed StepBudgetExceeded [0, 1]
        """,
    ),
    _rule(
        "S3-3", "which limit gets the blame",
        """
        Several limits can be passed at once, for example when one model reply brings many tokens
        and a high cost. The first limit to trip stops the run; at the same boundary the blame
        goes, in this order, to tokens, then cost, then turns, then steps and tool, agent and
        model calls, then time.
        """,
        """
        import nbbudget as nb
        from nbbudget.testing import Reply, ScriptedProvider

        model = ScriptedProvider([Reply("long", input_tokens=5000, output_tokens=100,
                                        cost_usd=1.0)])
        try:
            with nb.budget(tokens=1000, cost_usd=0.5) as run:
                run.provider(model)("summarise")
        except nb.BudgetCut as cut:
            print(cut.by)                               # the cost limit was passed too
        """,
        """
        tokens
        """,
    ),
    _rule(
        "S3-4", "a bad limit is a loud error",
        """
        A limit that is negative, zero, not finite, not an integer where an integer is meant, a
        bool, or too large is a `nb.ConfigError` that names the field and the value. It is never
        quietly replaced by a default. `None` means unbounded.
        """,
        """
        import nbbudget as nb

        for bad in ({"steps": 0}, {"steps": True}, {"cost_usd": float("nan")}):
            try:
                nb.Limits(**bad)
            except nb.ConfigError as err:
                print(err)
        print(nb.Limits(steps=None))                    # None: no limit
        """,
        """
        steps=0 must be greater than 0; use None for no limit
        steps=True is not a number; use a positive integer, or None for no limit
        cost_usd=nan is not finite; use None for no limit
        Limits()
        """,
    ),
    _rule(
        "S3-5", "approach notices",
        """
        While a limit is armed, a run gives at most two one-shot notices: when its highest
        consumption ratio crosses the first threshold ("start converging") and the second
        ("deliver now"). The defaults are 0.8 and 0.95; each must be in (0, 1] and the first no
        larger than the second. Notices are advice: they never stop the run, and a window that
        suspends ([S3-1](#s3-1)) gives none. An agent loop reads `run.notice_level` (0, 1 or 2);
        each notice is also an `approach_notice` trace event.
        """,
        """
        import nbbudget as nb

        with nb.budget(steps=100) as run:
            for i in range(96):
                run.step()
                if i + 1 in (79, 80, 95):
                    print(i + 1, run.notice_level)
        """,
        """
        79 0
        80 1
        95 2
        """,
    ),
    _rule(
        "S3-6", "a per-request cap is not a budget",
        """
        `max_output_tokens` bounds one reply. It is not an allowance: it does not carry over from
        one request to the next. The cumulative allowance is `output_tokens` ([S2-9](#s2-9)).
        """,
        """
        import nbbudget as nb
        from nbbudget.testing import Reply, ScriptedProvider

        model = ScriptedProvider([Reply("a", output_tokens=900), Reply("b", output_tokens=900)])
        with nb.budget() as run:
            ask = run.provider(model)
            ask("one", max_output_tokens=1000)
            ask("two", max_output_tokens=1000)
        print(model.calls)                              # the same cap for each request
        """,
        """
        [('one', 1000), ('two', 1000)]
        """,
    ),
    _rule(
        "S3-7", "degrading to a cheaper model",
        """
        `degrade=(cheaper_model, fraction)` switches the run to the cheaper model once the given
        fraction of the cost limit is spent. The switch happens once and is never undone, and the
        outcome records it in `degraded` (reason `budget`).
        """,
        """
        import nbbudget as nb

        def large_model(prompt, max_output_tokens=None):
            return {"text": "a long answer", "cost_usd": 0.45}

        def small_model(prompt, max_output_tokens=None):
            return {"text": "a short answer", "cost_usd": 0.01}

        with nb.budget(cost_usd=1.0) as run:
            ask = run.provider(large_model, degrade=(small_model, 0.8))
            for prompt in ("one", "two", "three"):
                print(ask(prompt)["text"])              # 0.90 spent after two: switch
        print(run.outcome.degraded)
        """,
        """
        a long answer
        a long answer
        a short answer
        {'from': 'large_model', 'to': 'small_model', 'reason': 'budget'}
        """,
    ),
    _rule(
        "S3-8", "a guardrail on every model call",
        """
        Each model call is bounded by a guardrail: one hour by default, `guardrail=0` turns it
        off. The guardrail does not need the call's cooperation: when it expires the caller stops
        waiting and the run fails with code `guardrail_timeout`. The call itself is abandoned
        (see [Limits](limits.md)).
        """,
        """
        import time
        import nbbudget as nb

        def hung_model(prompt, max_output_tokens=None):
            time.sleep(1)                               # never answers in time
            return {"text": "late"}

        try:
            with nb.budget() as run:
                run.provider(hung_model, guardrail="200ms")("hello")
        except nb.BudgetCut as cut:
            print(cut.by, run.outcome.status)
            print(cut)
        """,
        """
        guardrail failed
        provider hung_model did not answer within its guardrail of 200 ms (guardrail_timeout); the run stopped waiting for it
        """,  # noqa: E501 - the output as printed, one line
    ),
    _rule(
        "S3-9", "streams are cancelled at the limit",
        """
        An in-flight model stream is cancelled the moment cost or tokens pass their limit, instead
        of running to its end and being charged afterwards. In nbbudget this is always on: when a
        `run.provider` function returns an iterator, each chunk's usage is charged as it arrives
        and the stream is closed (its `close()` is called) as soon as any limit is passed.
        """,
        """
        import nbbudget as nb

        def stream(prompt, max_output_tokens=None):
            try:
                for i in range(10):
                    yield {"text": f"part {i}", "output_tokens": 100}
            finally:
                print("stream closed")

        try:
            with nb.budget(tokens=250) as run:
                for chunk in run.provider(stream)("write the report"):
                    print(chunk["text"])
        except nb.BudgetCut as cut:
            print(cut.by)
        """,
        """
        part 0
        part 1
        stream closed
        tokens
        """,
    ),
)

_S4 = (
    _rule(
        "S4-1", "the run limits",
        """
        A run may limit `run_ms` (active time), `steps`, `tool_calls`, `agent_invocations`
        (sub-agents started), `provider_calls` (model calls), `tokens`, `output_tokens`,
        `cost_usd` and `turns`. Integer limits are strictly positive and at most `2**53 - 1`
        (9007199254740991), the largest integer that a double-precision float, and so any JSON
        reader, holds exactly.
        """,
        """
        import nbbudget as nb

        print(nb.Limits(steps=100, tool_calls=20, cost_usd=0.50, run_ms=30_000))
        try:
            nb.Limits(tokens=2**53)
        except nb.ConfigError as err:
            print(err)
        """,
        """
        Limits(run_ms=30000, steps=100, tool_calls=20, cost_usd=0.5)
        tokens=9007199254740992 is too large; the most is 9007199254740991
        """,
    ),
    _rule(
        "S4-2", "the most restrictive source wins",
        """
        Limits can come from several sources: code, the magic's flags, `--run-limits-json`, a
        manifest file, the `NBBudget.limits` setting. The effective limit of each field is the
        smallest. A later source may restrict a limit but never widen it: trying is a
        `nb.WideningError` that names the field and both values.
        """,
        """
        import nbbudget as nb

        print(nb.Limits(steps=10) & nb.Limits(steps=20, tool_calls=3))
        try:
            nb.Limits(steps=10).restrict(nb.Limits(steps=20))
        except nb.WideningError as err:
            print(err)
        """,
        """
        Limits(steps=10, tool_calls=3)
        steps=20 would widen the limit steps=10 already in force; a later source may only restrict a limit, so use a value <= 10
        """,  # noqa: E501 - the output as printed, one line
    ),
    _rule(
        "S4-3", "one set of counters, checked and reserved atomically",
        """
        Sub-agents and parallel branches share the run's counters. Checking a limit and reserving
        the amount happen together, before the work is dispatched, as one atomic step: two
        branches can never both take the last permit. A dispatch that fails afterwards (a
        transport error, say) is not refunded: the attempt was made.
        """,
        """
        import nbbudget as nb

        with nb.budget(tool_calls=2) as run:
            run.charge("tool_calls", target="search")
            run.charge("tool_calls", target="search")
            try:
                run.charge("tool_calls", target="search")
            except nb.BudgetExceeded as refused:
                print(refused)
            print(run.consumed["tool_calls"])           # the refusal changed nothing
        """,
        """
        tool_calls for search would exceed the run's limit of 2 (2 used, 1 more requested); raise the limit or do less work
        2
        """,  # noqa: E501 - the output as printed, one line
    ),
    _rule(
        "S4-4", "pausing never resets a budget",
        """
        A checkpoint keeps the counters, the active time consumed and the effective ceilings. On
        resume, the saved and the current limits combine by minimum, so removing or raising a
        limit between two calls gives no extra budget. Time spent paused, or waiting for a person
        (inside `with run.paused():`), is not counted in `run_ms`.
        """,
        """
        import nbbudget as nb

        with nb.budget(steps=10) as run:
            run.step()
            run.step()
            state = run.state()                         # what a checkpoint saves
        later = nb.Budget.resume(state, nb.Limits(steps=100))    # asks for more: not given
        print(later.limits.steps, later.consumed["steps"])
        """,
        """
        10 2
        """,
    ),
    _rule(
        "S4-5", "an incomplete checkpoint is refused, not repaired",
        """
        A checkpoint without the complete state (an old format, a missing field, a bad signature)
        is refused as it is: never migrated, reset or rewritten. The call fails with the error
        code `checkpoint_refused`, names the checkpoint, and leaves it untouched for you to
        inspect.
        """,
        """
        import nbbudget as nb

        with nb.budget(steps=10) as run:
            run.step()
        state = run.state()
        del state["counts"]                             # a field is missing
        try:
            nb.Budget.resume(state)
        except nb.ConfigError as err:
            print(err)
        """,
        """
        ledger state lacks counts; it is refused unchanged
        """,
    ),
    _rule(
        "S4-6", "every attempt counts",
        """
        `provider_calls` counts every attempt at a model call, retries included.
        """,
        """
        import nbbudget as nb
        from nbbudget.testing import Reply, ScriptedProvider

        model = ScriptedProvider([Reply(error=ConnectionError("reset")), Reply("ok")])
        with nb.budget(provider_calls=5) as run:
            run.provider(model, retries=2)("hello")
        print(run.consumed["provider_calls"])           # the failed attempt and the retry
        """,
        """
        2
        """,
    ),
    _rule(
        "S4-7", "time grant and wall clock end differently",
        """
        Exceeding `run_ms` (the time grant) is a failure with a budget event: `failed`,
        `budget-cut`, by `timeout`. Exceeding `--timeout` (the wall clock) is `cancelled`. See
        [the three clocks](#the-three-clocks).
        """,
        """
        import time
        import nbbudget as nb

        def work():
            run = nb.current()
            while True:
                time.sleep(0.05)
                run.check()                             # stops here when a clock runs out

        granted = nb.call(work, limits=nb.Limits(run_ms=300))
        walled = nb.call(work, timeout="300ms")
        print(granted.exit_code, granted.error["code"])
        print(walled.exit_code, walled.error["code"])
        """,
        """
        1 budget_cut_timeout
        124 cancelled
        """,
    ),
    _rule(
        "S4-8", "every refusal is in the trace",
        """
        Every refused charge is a trace event `dispatch_refused_budget_exceeded` whose payload
        holds `budget_kind`, `limit_value`, `consumed_value`, `target_ref` and
        `runtime_error_code`.
        """,
        """
        import nbbudget as nb

        with nb.budget(tool_calls=1) as run:
            run.charge("tool_calls", target="search")
            try:
                run.charge("tool_calls", target="search")
            except nb.BudgetExceeded:
                pass
        for event in run.trace.events:
            if event.kind == "dispatch_refused_budget_exceeded":
                print(event.payload)
        """,
        """
        {'budget_kind': 'tool_calls', 'limit_value': 1, 'consumed_value': 1, 'target_ref': 'search', 'runtime_error_code': 'ToolCallBudgetExceeded'}
        """,  # noqa: E501 - the output as printed, one line
    ),
    _rule(
        "S4-9", "a trace can be summarised",
        """
        Inspecting a trace gives the number of budget checks, consumptions and refusals, and the
        kinds involved: `run.trace.summary()` in Python, `nbbudget inspect trace.json` on the
        [command line](cli.md).
        """,
        """
        import nbbudget as nb

        with nb.budget(steps=2, trace="full") as run:
            run.step()
            run.step()
            try:
                run.step()
            except nb.BudgetExceeded:
                pass
        summary = run.trace.summary()
        print(summary["checks"], summary["consumptions"], summary["refusals"], summary["kinds"])
        """,
        """
        3 2 1 ['steps', 'run_ms']
        """,
    ),
    _rule(
        "S4-10", "a budget bounds the next step, not the past",
        """
        A budget decides whether the next step may start. It never undoes an effect already done:
        a file written or a message sent before a limit was reached stays written or sent.
        """,
        """
        import nbbudget as nb

        sent = []
        try:
            with nb.budget(steps=2) as run:
                for message in ["one", "two", "three"]:
                    run.step()                          # may the next message go?
                    sent.append(message)
        except nb.BudgetExceeded:
            pass
        print(sent)                                     # what was sent stays sent
        """,
        """
        ['one', 'two']
        """,
    ),
    _rule(
        "S4-11", "parallel groups can be bounded",
        """
        A parallel group may bound `max_concurrency` (how many branches are alive at once) and
        `max_items` (how many branches there may be in all).
        """,
        """
        import nbbudget as nb

        with nb.budget(steps=100) as run:
            print(run.map(str.upper, ["a", "b", "c"], max_concurrency=2))
            try:
                run.map(str.upper, ["a", "b", "c"], max_items=2)
            except nb.ConfigError as err:
                print(err)
        """,
        """
        ['A', 'B', 'C']
        3 branches exceed max_items=2; split the work or raise max_items
        """,
    ),
    _rule(
        "S4-12", "a quota of runs per day",
        """
        A quota `runs_per_day` bounds how often the same work (by its key) may start in one
        calendar day (UTC). The count is kept in the store, so it survives kernel restarts, and
        several kernels sharing a store share the count. A continuation (the identical call
        reattaching to a running job or resuming from a checkpoint) is not a start. A start over
        the quota runs nothing: `nb.call` answers a failed response with the code
        `RunsPerDayExceeded`, and a cell raises `nb.RunsPerDayExceeded`.
        """,
        """
        import nbbudget as nb

        def build_report():
            return "report"

        for _ in range(3):
            response = nb.call(build_report, key="nightly-report", runs_per_day=2)
            print(response.ok, response.data if response.ok else response.error["code"])
        """,
        """
        True report
        True report
        False RunsPerDayExceeded
        """,
    ),
)

_N = (
    _rule(
        "N-1", "a program gets a call budget by default, a person does not",
        """
        A non-interactive driver (nbclient, papermill, nbval, an agent harness) gets the default
        call budget ([S0-3](#s0-3)); a person at a notebook front end does not ([S0-5](#s0-5)).
        nbbudget decides, in this order: `NBBUDGET_INTERACTIVE=1` (a person) or `0` (a program) in
        the environment; then the `NBBudget.interactive` setting; then the request itself: a
        person's front end sends a `cellId` in the request metadata and allows stdin, while
        nbclient, papermill and nbval send `allow_stdin: false` and no `cellId`. Outside a
        kernel, a terminal on stdin means a person.
        """,
        """
        import os
        import nbbudget as nb

        def total(numbers):
            return sum(numbers)

        for who in ("0", "1"):                          # a program, then a person
            os.environ["NBBUDGET_INTERACTIVE"] = who
            print(nb.call(total, [1, 2], detach=True).meta.get("budget_ms"))
        """,
        """
        30000
        None
        """,
    ),
    _rule(
        "N-2", "late output goes to the cell that started the work",
        """
        A detached cell's later output and result go to the cell that started it (on the
        ipykernel versions listed in [Limits](limits.md)). Drivers that drop late output can read
        it from the job: `nb.jobs[id].output_text`, or the `output` column of `%budget jobs`.
        """,
        """
        %%budget --detach --budget 1s
        import time
        print("started")
        time.sleep(2)                   # the cell answers INCOMPLETE after 1 s...
        print("finished")               # ...and this line still reaches it
        """,
        language="ipython",
    ),
    _rule(
        "N-3", "a live panel",
        """
        Each `%%budget` cell shows a panel with a bar per armed limit (consumed / limit), the
        clocks and the state, and a Stop button. Where widgets cannot render, a text summary
        stands in. The panel shows the state the cell ends in before the cell replies, in its
        envelope's words (`running in the background as job 1a2b-3`, `paused at checkpoint
        ...`); once the run has ended, its Stop and Pause buttons are gone.
        """,
        """
        %%budget --steps 100 --time 10s
        import time
        import nbbudget as nb
        for i in range(50):
            nb.current().step()         # the panel's steps bar fills to 50 / 100
            time.sleep(0.02)
        """,
        language="ipython",
    ),
    _rule(
        "N-4", "DataFrames",
        """
        Consumption (`run.usage()`), traces (`run.trace.to_frame()`) and jobs
        (`nb.jobs.to_frame()`) are available as pandas DataFrames (the `frames` extra).
        """,
        """
        import nbbudget as nb

        with nb.budget(steps=10, tool_calls=4) as run:
            run.step()
            run.charge("tool_calls", 2)
        frame = run.usage().loc[["steps", "tool_calls"], ["limit", "consumed", "remaining"]]
        print(frame.to_string(index_names=False))
        """,
        """
                    limit  consumed  remaining
        steps          10         1          9
        tool_calls      4         2          2
        """,
    ),
)

#: every rule, in the order of the documentation
RULES: tuple[Rule, ...] = _S0 + _S2 + _S3 + _S4 + _N
