"""The low-level API of a run, for the layers built on it: tools, providers, branches, calls
and the pydantic-ai adapter. Users need none of it.

A run (`nb.Budget`) is a small facade over three parts, each replaceable on its own:

- a **ledger** account (`nbbudget.core.ledger`; the ledger is made by the `LedgerFactory` the run
  is given, ``nb.Budget(..., ledger=...)``): what the run or grant may spend and has spent;
  check-and-reserve over a grant and its run, all or nothing; spending after the fact;
- a **scope** (`nbbudget.core.scope`): the stop tree, the deadline and the pause;
- a **recorder** (`nbbudget.core.trace.Recorder`): the events of its trace.

Beside the ledger's counters by kind, the `Core` keeps what the run spent on each model it
called (``run.usage(by="model")``): its **tally**, one row per model (a `Model`, the provider
and the model's name), written under the ledger's lock with the charges it goes with. A
grant's rows count in its run's too, as its consumption does. The tally is kept in this
process, whichever ledger keeps the counters: a run whose counters live on a cluster's
scheduler shows the model calls made here, not those of its branches on workers.

``run.lowlevel`` is the run's `Core`, which ties the three together: every refusal and every cut
goes through it, so each one is traced the same way (S4-8). Helpers take what they need from it
and never another module's private names.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, Protocol

from .clock import Clock
from .errors import BudgetExceeded, ConfigError
from .kinds import KINDS, RUN_MS
from .ledger import Account, Ledger, LedgerFactory, LocalLedger, Worst, plain
from .limits import Limits
from .outcome import Status
from .preempt import Entry
from .scope import Incomplete, Scope, Stop, Unwind
from .snapshot import ModelUsage
from .trace import Recorder, Trace

__all__ = ["Core", "Incomplete", "Model", "Recorder", "Run", "Scope", "Stop", "Unwind"]

_TIME = KINDS[RUN_MS].name  # the kind the run's clock spends

#: a model as a run's tally names it, the provider and the model's name (``("openai",
#: "gpt-4o")``): what the model clients and the adapters give with a model call's charges
Model = tuple[str, str]
#: a tally's row: calls, input tokens, output tokens, dollars (None: no price known)
_Row = list[Any]
#: `Core.spend`'s *used* when none is given
_NOTHING_USED = (0, 0, 0, None)


class Run(Protocol):
    """What the helpers built on a run use of it: `nb.Budget` is one."""

    name: str

    @property
    def lowlevel(self) -> Core: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def consumed(self) -> Mapping[str, float]: ...

    def charge(self, kind: str, n: float = 1, *, target: str | None = None) -> None: ...

    def check(self) -> None: ...

    def remaining(self, kind: str) -> float: ...

    def grant(self, *, time: int | str | None = None, name: str | None = None,
              **limit_fields: Any) -> Run: ...

    def interrupt_here(self) -> Entry | None: ...

    def interrupt_done(self, entry: Entry) -> None: ...


class Core:
    """One run's or grant's ledger account, scope and recorder, and the paths through them:
    reserve, require, spend, refuse and cut. A run (``nbbudget.run.budget``) builds one with
    `Core.run` and a grant with `Core.grant`; tools, providers, branches, calls and the
    pydantic-ai adapter reach it as ``run.lowlevel``."""

    __slots__ = ("account", "clock", "degraded", "held", "ledger", "name", "recorder", "scope",
                 "tallies")

    def __init__(self, name: str, ledger: Ledger, account: Account, scope: Scope,
                 run_tally: dict[Model, _Row] | None = None) -> None:
        """Tie *account* (in *ledger*) and *scope*, neither started yet, together: the scope is
        given its time grant and what its stop and its deadline mean for the account; a run's
        (the ledger's root account) also its time notices (S3-5). A grant's *run_tally* is its
        run's tally, which its model calls count in too."""
        self.name = name
        self.ledger = ledger
        self.account = account
        self.scope = scope
        self.recorder: Recorder = scope.recorder
        self.clock: Clock = scope.clock
        self.degraded: dict[str, str] | None = None  # S3-7: set once, when it degrades
        # spending under way, charged as it completes, or at the end at the latest (`hold`)
        self.held: set[Callable[[], None]] = set()
        # what it spent on each model: its own tally, then (a grant's) its run's (`models`)
        own: dict[Model, _Row] = {}
        self.tallies = (own,) if run_tally is None else (own, run_tally)
        if account is ledger.root:
            scope.attach(account.thr[RUN_MS], on_halt=self._on_halt, on_expire=self.expired,
                         notice_times=ledger.time_notices, on_notice=self._on_time_notice)
        else:
            scope.attach(account.thr[RUN_MS], on_halt=self._on_halt, on_expire=self.expired)

    @classmethod
    def run(cls, name: str, limits: Limits, clock: Clock, *, full: bool, suspend: bool,
            totals: Limits, notices: tuple[float, float] | None,
            ledger: LedgerFactory = LocalLedger) -> Core:
        """The parts of a new run: its trace, its scope, and its account in a new ledger made
        by *ledger* (a `LedgerFactory`; a `LocalLedger` unless told)."""
        if not callable(ledger):
            raise ConfigError(f"ledger must be a ledger factory such as LocalLedger, not "
                              f"{type(ledger).__name__}")
        log = Trace(full=full, name=name, limits=limits.to_dict(), notices=list(notices or ()))
        lock, recorder = threading.Lock(), Recorder(log, name)
        scope = Scope(name, recorder, clock, lock=lock)
        made = ledger(name, limits, recorder, clock=clock, lock=lock, suspend=suspend,
                      totals=totals, notices=notices, elapsed=scope.elapsed_ms, full=full)
        if full:
            made.traced_pools(scope)
        made.bind(scope)
        core = cls(name, made, made.root, scope)
        log.follow(core.stats)
        return core

    def grant(self, name: str | None, limits: Limits) -> Core:
        """The parts of a grant of this run or grant (lock held): a child scope, whose time
        never outlives this one's (S2-1), and a child account (S2-2)."""
        trace, scope = self.recorder.trace, self.scope
        name = name or f"{self.name}/grant-{trace.run_count()}"
        recorder = Recorder(trace, name)
        child = Scope(name, recorder, scope.clock, parent=scope, lock=scope.lock)
        account = self.ledger.open(name, limits, recorder, self.account)
        left = scope.remaining_ms()
        if left is not None:
            account.limit_time(left)
        core = Core(name, self.ledger, account, child, self.tallies[-1])
        scope.adopt(child)
        time_ms = account.thr[RUN_MS]
        child.record("grant", {"parent": self.name, "limits": limits.to_dict(),
                               "time_ms": plain(time_ms) if time_ms != math.inf else None})
        return core

    def _on_halt(self) -> None:
        """The scope stopped (lock held): every later charge takes the locked path, and
        raises."""
        self.ledger.drain(self.account)

    def _on_time_notice(self) -> None:
        """A time notice of the run may be due (lock held, S3-5)."""
        self.ledger.notice(self.scope.t_ms())

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Continue from a checkpoint's ledger state (read with `ledger.read_state`): its
        counters, notices and active time (S4-4)."""
        self.ledger.restore(saved)
        with self.ledger.lock:
            for provider, model, *row in saved.get("models", ()):
                _tally(self.tallies, (provider, model), row)
        self.scope.resume_from(float(saved["active_ms"]), self.account.thr[RUN_MS])
        self.record("resumed", {"counts": dict(saved["counts"]),
                                "active_ms": saved["active_ms"]})

    def end(self, ended: dict[str, Any]) -> None:
        """The run or grant ended with the outcome *ended* (lock held): traced, and its
        time stops."""
        self.record("outcome", ended)
        self.scope.end_time()
        self.ledger.end(self.account)
        if self.scope.parent is None:
            self.recorder.trace.ended(ended)

    def end_at(self, ended: dict[str, Any], now_ms: float) -> None:
        """The run ended with the outcome *ended* at *now_ms* on its clock, before these
        parts were built: traced at that time, and its time stopped then."""
        scope = self.scope
        started = scope.root.started_ms
        self.recorder.add("outcome", 0.0 if started is None else now_ms - started, ended)
        scope.end_time(now_ms)
        self.ledger.end(self.account)
        if scope.parent is None:
            self.recorder.trace.ended(ended)

    # -- reading --------------------------------------------------------------------------------
    def consumed(self) -> dict[str, float]:
        """What was spent, by kind, time included (whole milliseconds)."""
        out = self.ledger.consumed(self.account)
        elapsed = self.scope.elapsed_ms()
        if elapsed:
            out[_TIME] = round(elapsed)
        return out

    def remaining(self, i: int) -> float:
        """What is left of kind *i*: the smaller of this account's own and the run's."""
        if i == RUN_MS:
            left = self.scope.remaining_ms()
            return math.inf if left is None else left
        with self.ledger.lock:
            return plain(self.ledger.remaining(self.account, i))

    def remaining_of(self, kinds: tuple[int, ...]) -> tuple[float, ...]:
        """What is left of each of *kinds* (not time), read together under the ledger's lock:
        for a stream's meter in the model clients (``nbbudget.integrations.models``), which
        asks for three at a stream's start and after each charge."""
        ledger, account = self.ledger, self.account
        with ledger.lock:
            return tuple(plain(ledger.remaining(account, i)) for i in kinds)

    def models(self) -> tuple[ModelUsage, ...]:
        """What this run (every grant's included) or grant spent on each model it called, in
        the order it first called them: its snapshot's ``models``."""
        with self.ledger.lock:
            rows = [(*model, *row) for model, row in self.tallies[0].items()]
        return tuple(ModelUsage(provider, model, calls, int(inp), int(out),
                                None if cost is None else round(cost, 12))
                     for provider, model, calls, inp, out, cost in rows)

    def models_state(self) -> list[list[Any]]:
        """The tally as a checkpoint keeps it (S4-4), beside the ledger's state: a list of
        ``[provider, model, calls, input tokens, output tokens, dollars or None]``, which
        `restore` takes back. ``Budget.state`` adds it when the run called a model."""
        return [[m.provider, m.model, m.calls, m.input_tokens, m.output_tokens, m.cost_usd]
                for m in self.models()]

    def stats(self) -> dict[str, dict[str, float]]:
        """Checks, consumptions, amounts and refusals by kind, for the trace's summary (S4-9)."""
        stats = self.ledger.stats(self.recorder.trace.refusals_by_kind())
        elapsed = self.scope.elapsed_ms()
        if self.account.limits.run_ms is not None or elapsed:
            stats["consumed"][_TIME] = round(elapsed)
        return stats

    # -- before dispatch ------------------------------------------------------------------------
    def charge(self, i: int, n: float, target: str | None) -> None:
        """The locked path of one charge of *n* of kind *i* (its pool was empty, or the amount
        is not 1). A limit spent for good refuses without the lock."""
        stop = self.scope.stop
        if stop is not None:
            raise stop.signal()
        account = self.account
        if account.exhausted[i] and n:  # nothing can free a unit
            self.fail(self.ledger.refuse(account, account, i, n, target, self.scope.t_ms()))
        self.reserve(((i, n),), target)

    def reserve(self, items: Sequence[tuple[int, float]], target: str | None,
                model: Model | None = None) -> None:
        """Reserve every item on this account and its run's, all or nothing (S4-3); a refusal
        is traced and raised, and leaves the counters as they were. With *model*, the items
        are a call of that model, counted in the tally with them."""
        scope = self.scope
        with self.ledger.lock:
            stop = scope.stop or scope.root.stop
            err: BaseException | None = stop.signal() if stop is not None else (
                self.ledger.reserve(self.account, items, target, scope.t_ms()))
            if err is None and model is not None:
                _called(self.tallies, model)
        if err is not None:
            self.fail(err)

    def reserve_within(self, items: Sequence[tuple[int, float]], i: int,
                       target: str | None, model: Model | None = None) -> float:
        """Reserve *items* as `reserve` does, unless kind *i* has less than one unit left: that
        refuses first, and nothing is reserved (a model request when no output token is left,
        S2-9); what is left of kind *i*. What a model request takes before it is sent, under one
        lock, counted as a call of *model* in the tally when given:
        `nbbudget.run.providers.reserve_request` calls it."""
        scope, ledger, account = self.scope, self.ledger, self.account
        with ledger.lock:
            stop = scope.stop or scope.root.stop
            if stop is not None:
                err: BaseException = stop.signal()
            else:
                left = ledger.reserve_within(account, items, i, target, scope.t_ms)
                if not isinstance(left, BudgetExceeded):
                    if model is not None:
                        _called(self.tallies, model)
                    # a whole count is returned as it is: `plain`'s own test, without its call
                    return left if type(left) is int else plain(left)
                err = left
        self.fail(err)

    def reserve_costed(self, items: Sequence[tuple[int, float]], i: int, c: int,
                       fixed: float, rate: float, asked: float,
                       target: str | None, clamp: bool = True,
                       model: Model | None = None) -> tuple[float, float]:
        """`reserve_within` for a request whose cost is reserved too, at its worst case (S3-10):
        *fixed* dollars (its input, bounded from above) plus *rate* dollars for each output
        token of its cap, kind *c* being the dollars and kind *i* the output tokens. The cap is
        *asked* (``inf``: none asked) clamped to what kind *i* has left and to what the dollars
        left can pay for; less than one token affordable refuses by kind *c*, traced, and
        nothing is reserved. The cap and the dollars reserved, all under one lock, so that
        requests sharing the dollars never reserve more than is left between them. Not
        *clamp*: the caller cannot change the cap it sends (a framework's callback), so it is
        never lowered: a worst case that does not fit is refused whole. Counted as a call of
        *model* in the tally when given. `nbbudget.run.providers.reserve_priced` calls it when
        the dollars are limited."""
        scope, ledger = self.scope, self.ledger
        with ledger.lock:
            stop = scope.stop or scope.root.stop
            got = stop.signal() if stop is not None else ledger.reserve_costed(
                self.account, items, i, c, Worst(fixed, rate, asked, clamp), target, scope.t_ms)
            if type(got) is tuple:
                if model is not None:
                    _called(self.tallies, model)
                return got
        assert isinstance(got, BaseException)
        self.fail(got)

    def limited(self, i: int) -> bool:
        """Whether kind *i* has a limit on this account or its run's (read without the lock:
        limits change only when a run starts or resumes). The model clients ask it of
        ``cost_usd`` before each request (``nbbudget.integrations.models``)."""
        return self.account.thr[i] != math.inf or self.ledger.root.thr[i] != math.inf

    def require(self, i: int, n: float, target: str | None) -> None:
        """Refuse *n* of kind *i* (traced) unless this account and its run's both have that
        much left; nothing is reserved (a clamp before dispatch, S2-9). A stopped run raises its
        stop first, as a charge does (S2-3)."""
        scope = self.scope
        with self.ledger.lock:
            stop = scope.stop or scope.root.stop
            err: BaseException | None = stop.signal() if stop is not None else (
                self.ledger.check(self.account, i, n, target, scope.t_ms()))
        if err is not None:
            self.fail(err)

    def fail(self, err: BaseException) -> NoReturn:
        """Raise *err* (outside the lock). A spent window suspends the run instead (S3-1)."""
        if isinstance(err, BudgetExceeded) and err.window:
            root = self.scope.root
            root.halt(Stop.of(Status.SUSPENDED, f"the {err.kind} window of {plain(err.limit)} "
                              f"is spent; the run is suspended and resumes with a fresh window",
                              root, by=err.kind))
            assert root.stop is not None
            err = root.stop.signal()
        try:
            raise err
        finally:
            del err  # no cycle through this frame

    # -- after the fact -------------------------------------------------------------------------
    def spend(self, items: Sequence[tuple[int, float]], target: str | None,
              model: Model | None = None,
              used: tuple[int, float, float, float | None] = _NOTHING_USED) -> None:
        """Record spending that already happened (S4-10): counted even past a limit, then this
        grant or its run is cut by the first limit passed, in the attribution order (S2-9,
        S3-3). *items* are ``(kind index, amount)`` pairs in that order, already checked. With
        *model*, what they stand for is added to its row of the tally with them: *used*, the
        calls, input tokens, output tokens and dollars (None: no price) of its reply."""
        with self.ledger.lock:
            if model is not None:
                _tally(self.tallies, model, used)
            passed = self.ledger.spend(self.account, items, target, self.scope.t_ms)
            if not passed:
                return
            stops = [self._passed(holder, i) for holder, i in passed]
        for stop in stops:  # this grant's own cut first, then its run's (S3-2)
            stop.origin.halt(stop)
        first = stops[0].origin.stop
        assert first is not None
        raise first.signal()

    def _passed(self, holder: Account, i: int) -> Stop:
        """The cut of *holder*'s scope (this one, or the run) by kind *i*, whose limit it
        passed."""
        scope = self.scope if holder is self.account else self.scope.root
        limit, used = holder.figures(i)
        name = KINDS[i].name
        if self.ledger.window(holder, i):  # S3-1: a spent window suspends, as a refusal does
            return Stop.of(Status.SUSPENDED, f"the {name} window of {limit} is spent; the run "
                           f"is suspended and resumes with a fresh window", scope, by=name)
        return cut(scope, i, (limit, used), name,
                   f"{name} passed {scope.name}'s limit of {limit}: {used} used; raise the "
                   f"limit or ask for less")

    def expired(self) -> Stop:
        """The stop of a spent time grant: a fresh window to come when the run suspends (S3-1),
        else a cut by ``timeout`` (S4-7)."""
        scope, ledger = self.scope, self.ledger
        total = ledger.totals.run_ms
        if ledger.suspend and self.account is ledger.root and not (
                total is not None and scope.elapsed_ms() >= total):
            return Stop.of(Status.SUSPENDED, f"the time window of "
                           f"{self.account.limits.run_ms} ms is spent; the run is suspended "
                           f"and resumes with a fresh window", scope, by=_TIME)
        limit = plain(scope.limit_ms)
        return cut(scope, RUN_MS, (limit, plain(round(scope.elapsed_ms(), 3))), "timeout",
                   f"{scope.name} ran out of time: its time grant of {limit} ms is spent; give "
                   f"it more time or do less work")

    def hold(self, settle: Callable[[], None]) -> None:
        """Spending under way whose charge waits for it to complete: *settle* charges what it
        has used so far, and is called as the run's or grant's block ends unless `release`
        came first. A model stream's meter (``nbbudget.integrations.models``) holds one: a
        stream its caller leaves without closing it (a ``break`` in a notebook, the stream kept
        in a variable) is charged what it received by the end of the block, at the latest.
        *settle* raises nothing; a limit its charge passes stops the run as any charge does."""
        self.held.add(settle)

    def release(self, settle: Callable[[], None]) -> None:
        """The spending *settle* stood for (`hold`) is charged in full."""
        self.held.discard(settle)

    def settle_held(self) -> None:
        """Charge the spending still under way (`hold`): the run's or grant's block ends."""
        held = self.held
        while True:
            try:
                settle = held.pop()
            except KeyError:  # none left (a stream's own end may release one meanwhile)
                return
            settle()

    # -- events ---------------------------------------------------------------------------------
    def record(self, kind: str, payload: dict[str, Any]) -> None:
        """Add an event of *kind* to the run's trace."""
        self.scope.record(kind, payload)

    def degrade(self, how: dict[str, str]) -> None:
        """S3-7: from now on this run or grant uses a cheaper model; its outcome says so."""
        self.degraded = how
        self.record("degraded", dict(how))


def _called(tallies: tuple[dict[Model, _Row], ...], model: Model) -> None:
    """One call of *model* in each of *tallies* (the ledger's lock held): the call's own row
    made at its first, with no tokens and no price yet."""
    for rows in tallies:
        row = rows.get(model)
        if row is None:
            rows[model] = [1, 0, 0, None]
        else:
            row[0] += 1


def _tally(tallies: tuple[dict[Model, _Row], ...], model: Model,
           used: Sequence[Any]) -> None:
    """Add *used*, calls, input and output tokens and dollars (None: no price), to *model*'s
    row in each of *tallies* (the ledger's lock held)."""
    calls, inp, out, cost = used
    for rows in tallies:
        row = rows.get(model)
        if row is None:
            row = rows[model] = [0, 0, 0, None]
        row[0] += calls
        row[1] += inp
        row[2] += out
        if cost is not None:
            row[3] = cost if row[3] is None else row[3] + cost


def cut(scope: Scope, i: int, figures: tuple[float, float], by: str, message: str) -> Stop:
    """A cut of *scope* by kind *i*: ``failed``, cause ``budget-cut``, with the limit and what
    was consumed in its trace event (S2-4, S4-8). `Core` makes its cuts by a limit or by
    time with it."""
    kind = KINDS[i]
    return Stop.of(Status.FAILED, message, scope, by=by, code=kind.code,
                   figures=(kind.name, *figures))
