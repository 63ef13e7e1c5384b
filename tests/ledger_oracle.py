"""A reference ledger, written from the rules alone, for the model-based tests of nbbudget's own.

It models S2-1 (a grant's deadline), S2-2 (a grant's own allowances), S2-3 (a stop reaches every
descendant), S3-1 (windows that suspend, frozen totals), S3-3 (attribution order), S4-3 (every
charge counts run-wide, all or nothing), S4-4 (a resume keeps the counters and takes the minimum
of the limits), S4-8 (each refusal, with its figures) and S4-9 (consumptions and refusals by
kind). It is deliberately simple: one lock, a dict of accounts, plain sums, no pools, no fast
path, so that each method can be read against the rule it names. It is a test oracle only.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: the kinds a charge takes, in the attribution order of S3-3: tokens > cost > turns > calls
KINDS = ("tokens", "output_tokens", "cost_usd", "turns", "steps", "tool_calls",
         "agent_invocations", "provider_calls")
#: each kind's place in that order; the calls and steps tie (S3-3)
RANKS = {"tokens": 0, "output_tokens": 1, "cost_usd": 2, "turns": 3, "steps": 4, "tool_calls": 4,
         "agent_invocations": 4, "provider_calls": 4}
#: the kinds whose limit is a per-slice window on a run that suspends (S3-1); time is the third
WINDOWS = frozenset({"tokens", "cost_usd"})
CODES = {"tokens": "TokenBudgetExceeded", "output_tokens": "OutputTokenBudgetExceeded",
         "cost_usd": "CostBudgetExceeded", "turns": "TurnBudgetExceeded",
         "steps": "StepBudgetExceeded", "tool_calls": "ToolCallBudgetExceeded",
         "agent_invocations": "AgentInvocationBudgetExceeded",
         "provider_calls": "ProviderCallBudgetExceeded"}
INF = math.inf
GRANTED = "granted"
STOPPED = "stopped"  # the budget (or an ancestor) is stopped: the operation raises its stop
FAILED_DISPATCH = "failed dispatch"  # a provider attempt that raised: its permit stays spent
PROVIDER = "provider:model"  # the target of the provider calls the tests make


@dataclass(frozen=True)
class Refusal:
    """One refused charge, as S4-8 traces it and `nb.BudgetExceeded` carries it."""

    kind: str
    limit: float
    consumed: float
    requested: float
    target: str | None
    scope: str  # "run" or "grant"

    @property
    def code(self) -> str:
        return CODES[self.kind]


@dataclass
class Account:
    """One budget: the run (no parent) or a grant. ``spent`` is run-wide on the run and the
    grant's own charges on a grant (S2-2); ``stop`` is ``(status, by)`` once it stops itself."""

    name: str
    parent: Account | None
    limits: dict[str, float]
    started_ms: float
    deadline_ms: float | None = None
    spent: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    stop: tuple[str, str | None] | None = None


class Ledger:
    """A run and its grants. Every change takes the one lock; amounts are plain sums."""

    def __init__(self, limits: Mapping[str, float], *, suspend: bool = False,
                 totals: Mapping[str, float] | None = None, name: str = "run",
                 now_ms: float = 0.0, counts: Mapping[str, float] | None = None,
                 active_ms: float = 0.0) -> None:
        self._lock = threading.Lock()
        self.suspend = suspend
        self.totals = dict(totals or {})
        self.now_ms = now_ms
        self.active_before_ms = active_ms
        root = Account(name, None, dict(limits), now_ms, spent=defaultdict(float, counts or {}))
        self._accounts: dict[str, Account] = {name: root}
        self.root = root
        #: what earlier slices spent of each window (S3-1); zero without suspend
        self.base = {k: (root.spent[k] if suspend and k in WINDOWS else 0.0) for k in KINDS}
        self.base_ms = active_ms if suspend else 0.0
        self.refusals: list[Refusal] = []
        self.consumptions: Counter[str] = Counter()  # granted charges by kind, this run (S4-9)
        #: each granted charge, as a full trace records it: kind, amount, target, budget
        self.charges: list[tuple[str, float, str | None, str]] = []
        root.deadline_ms = self._root_deadline()

    # -- reading ---------------------------------------------------------------------------
    def stopped(self, name: str) -> bool:
        """S2-3: a budget is stopped when it, or any ancestor, is."""
        acct: Account | None = self._accounts[name]
        while acct is not None:
            if acct.stop is not None:
                return True
            acct = acct.parent
        return False

    def ceiling(self, kind: str) -> float:
        """The run's ceiling for *kind*: this slice's window, within the frozen total (S3-1)."""
        limit = self.root.limits.get(kind)
        window = INF if limit is None else self.base.get(kind, 0) + limit
        return min(window, self.totals.get(kind, INF))

    def own_remaining(self, name: str, kind: str) -> float:
        """What is left of *kind* on this budget's own figures (a grant's allowance)."""
        acct = self._accounts[name]
        if acct is self.root:
            return max(0, self.ceiling(kind) - acct.spent[kind])
        return max(0, acct.limits.get(kind, INF) - acct.spent[kind])

    def remaining(self, name: str, kind: str) -> float:
        """The smaller of a grant's own remaining and the run's."""
        return min(self.own_remaining(name, kind), self.own_remaining(self.root.name, kind))

    def remaining_ms(self, name: str) -> float | None:
        deadline = self._accounts[name].deadline_ms
        return None if deadline is None else max(0.0, deadline - self.now_ms)

    def consumed(self, name: str) -> dict[str, float]:
        """The non-zero counters of a budget, with its active time as ``run_ms``."""
        acct = self._accounts[name]
        out = {k: v for k, v in acct.spent.items() if v}
        elapsed = self.now_ms - acct.started_ms
        if acct is self.root:
            elapsed += self.active_before_ms
        if round(elapsed):
            out["run_ms"] = round(elapsed)
        return out

    def stop_of(self, name: str) -> tuple[str, str | None] | None:
        return self._accounts[name].stop

    # -- grants, stops and time --------------------------------------------------------------
    def grant(self, parent: str, name: str, limits: Mapping[str, float]) -> None:
        """S2-1, S2-2: own allowances; a deadline no later than the parent's remaining time."""
        with self._lock:
            up = self._accounts[parent]
            acct = Account(name, up, dict(limits), self.now_ms)
            times = [t for t in (limits.get("run_ms"), self.remaining_ms(parent)) if t is not None]
            acct.deadline_ms = self.now_ms + min(times) if times else None
            self._accounts[name] = acct

    def cancel(self, name: str) -> None:
        with self._lock:
            self._halt(self._accounts[name], "stopped", None)

    def pause(self, ms: float) -> None:
        """Time passes with the run paused: no budget's clock moves (S4-4)."""
        with self._lock:
            self.now_ms += ms
            for acct in self._accounts.values():
                acct.started_ms += ms
                if acct.deadline_ms is not None:
                    acct.deadline_ms += ms

    def advance(self, ms: float) -> None:
        """Move time on: each budget whose deadline passes stops (S2-1, S3-1)."""
        with self._lock:
            self.now_ms += ms
            for acct in self._accounts.values():
                if acct.deadline_ms is not None and acct.deadline_ms <= self.now_ms:
                    self._halt(acct, *self._time_stop(acct))

    def _time_stop(self, acct: Account) -> tuple[str, str]:
        """A spent time window suspends a run that suspends, unless its total is spent too."""
        total = self.totals.get("run_ms")
        if acct is self.root and self.suspend and not (
                total is not None and self.ceiling_ms() >= total):
            return "suspended", "run_ms"
        return "failed", "timeout"

    def ceiling_ms(self) -> float:
        window = self.root.limits.get("run_ms", INF) + self.base_ms
        return min(window, self.totals.get("run_ms", INF))

    def _root_deadline(self) -> float | None:
        ceiling = self.ceiling_ms()
        if ceiling == INF:
            return None
        return self.root.started_ms + ceiling - self.active_before_ms

    def _halt(self, acct: Account, status: str, by: str | None) -> None:
        if acct.stop is None:  # the first stop wins
            acct.stop = (status, by)

    # -- charges (S2-2, S4-3, S4-8) ----------------------------------------------------------------
    def charge(self, name: str, kind: str, n: float = 1, target: str | None = None) -> Any:
        """Check and reserve *n* of *kind*: `GRANTED`, a `Refusal` (nothing changed anywhere),
        or `STOPPED` (the budget is stopped, or this refusal spent a window and suspended it)."""
        with self._lock:
            return self._charge(self._accounts[name], {kind: n}, target)

    def charge_many(self, name: str, amounts: Mapping[str, float],
                    target: str | None = None) -> Any:
        """Several kinds at once, all or nothing; a refusal names the first kind, in the
        attribution order, that cannot be had (S3-3), on the grant's allowance or the run's."""
        with self._lock:
            return self._charge(self._accounts[name], amounts, target)

    def _charge(self, acct: Account, amounts: Mapping[str, float], target: str | None) -> Any:
        if self.stopped(acct.name):
            return STOPPED
        root = self.root
        ordered = sorted(amounts.items(), key=lambda item: RANKS[item[0]])
        for kind, n in ordered:
            if acct is not root and acct.spent[kind] + n > acct.limits.get(kind, INF):
                return self._refuse(Refusal(kind, acct.limits[kind], acct.spent[kind], n,
                                            target, "grant"))
            if root.spent[kind] + n > self.ceiling(kind):
                refusal, window = self._run_refusal(kind, n, target)
                self._refuse(refusal)
                if window:
                    self._halt(root, "suspended", kind)  # S3-1: a spent window suspends it
                    return STOPPED
                return refusal
        for kind, n in ordered:
            self._add(acct, kind, n, target)
        return GRANTED

    def _run_refusal(self, kind: str, n: float, target: str | None) -> tuple[Refusal, bool]:
        """The figures of a refusal by the run, and whether it is a window's (S3-1): a frozen
        total that would be passed refuses as the total, loudly; a window as this slice's."""
        spent = self.root.spent[kind]
        total = self.totals.get(kind)
        if total is not None and spent + n > total:
            return Refusal(kind, total, spent, n, target, "run"), False
        base = self.base[kind]
        refusal = Refusal(kind, self.ceiling(kind) - base, spent - base, n, target, "run")
        return refusal, self.suspend and kind in WINDOWS

    def _refuse(self, refusal: Refusal) -> Refusal:
        self.refusals.append(refusal)  # S4-8: every refusal is traced
        return refusal

    def _add(self, acct: Account, kind: str, n: float, target: str | None) -> None:
        acct.spent[kind] += n
        if acct is not self.root:
            self.root.spent[kind] += n
        self.consumptions[kind] += 1
        self.charges.append((kind, n, target, acct.name))

    # -- provider calls: usage spent after the fact (S2-9, S3-3, S4-6, S4-10) ----------------------
    def ask(self, name: str, *, input_tokens: int, output_tokens: int, cost_usd: float,
            error: bool = False, cancel: str | None = None) -> Any:
        """One provider call on budget *name*: a refusal when no output token is left, else a
        ``provider_calls`` permit, then (unless the attempt fails) the reply's usage, its output
        clamped to what was left, counted even past a limit. A passed limit stops its holder, by
        the first kind in the attribution order (S3-3). *cancel* names a budget stopped while
        the model answers: what the reply used is still counted (S4-10). Returns the output
        tokens the reply kept, or `STOPPED`, a `Refusal` or `FAILED_DISPATCH`."""
        with self._lock:
            acct = self._accounts[name]
            if self.stopped(name):
                return STOPPED
            left = self.remaining(name, "output_tokens")
            if left < 1:  # S2-9: nothing left to ask for; refused and traced like any charge
                return self._no_output(acct)
            permit = self._charge(acct, {"provider_calls": 1}, PROVIDER)
            if permit is not GRANTED or error:
                return permit if permit is not GRANTED else FAILED_DISPATCH
            if cancel is not None:
                self._halt(self._accounts[cancel], "stopped", None)
            out = min(output_tokens, left)
            self._spend(acct, [("tokens", input_tokens + out), ("output_tokens", out),
                               ("cost_usd", cost_usd)])
            return STOPPED if self.stopped(name) else out

    def request(self, name: str, asked: int | None, retry: bool) -> Any:
        """A model request before it is sent, as a model client or an agent adapter makes it:
        refused when no output token is left (S2-9, as `ask`), else its first attempt takes
        one ``turns`` and one ``provider_calls`` permit, both or neither (S4-3), and a retry
        one more ``provider_calls`` permit (S4-6). Returns the output cap to send, *asked*
        clamped to what is left (None: none asked and none needed), or `STOPPED` or a
        `Refusal`."""
        with self._lock:
            acct = self._accounts[name]
            if self.stopped(name):
                return STOPPED
            left = self.remaining(name, "output_tokens")
            if left < 1:
                return self._no_output(acct)
            permits = {"provider_calls": 1} if retry else {"turns": 1, "provider_calls": 1}
            taken = self._charge(acct, permits, PROVIDER)
            if taken is not GRANTED:
                return taken
            if left == INF:
                return asked
            return int(left) if asked is None else int(min(asked, left))

    def _no_output(self, acct: Account) -> Refusal:
        """The refusal of a model request with no output token left (S2-9): by the grant's own
        allowance first, else by the run's; traced like any refusal (S4-8)."""
        if acct is not self.root and self.own_remaining(acct.name, "output_tokens") < 1:
            return self._refuse(Refusal("output_tokens", acct.limits["output_tokens"],
                                        acct.spent["output_tokens"], 1, PROVIDER, "grant"))
        return self._refuse(self._run_refusal("output_tokens", 1, PROVIDER)[0])

    def _spend(self, acct: Account, items: list[tuple[str, float]]) -> None:
        for kind, n in items:
            if n:
                self._add(acct, kind, n, PROVIDER)
        root = self.root
        over = [k for k, n in items if n and root.spent[k] > self.ceiling(k)]
        if over:
            kind = over[0]
            total = self.totals.get(kind)
            window = self.suspend and kind in WINDOWS and not (
                total is not None and root.spent[kind] > total)
            self._halt(root, "suspended" if window else "failed", kind)
        own = [k for k, n in items if n and acct.spent[k] > acct.limits.get(k, INF)]
        if acct is not root and own:
            self._halt(acct, "failed", own[0])

    def over(self, name: str, amounts: Mapping[str, float]) -> tuple[list[str], list[str]]:
        """The kinds whose limit *amounts* added on *name* would pass: the run's, the grant's."""
        with self._lock:
            acct = self._accounts[name]
            run = [k for k, n in amounts.items() if self.root.spent[k] + n > self.ceiling(k)]
            own = [k for k, n in amounts.items() if acct is not self.root
                   and acct.spent[k] + n > acct.limits.get(k, INF)]
            return run, own

    # -- checkpoints (S4-4) ---------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the counters, the active time, the limits in force."""
        with self._lock:
            return {"name": self.root.name, "limits": dict(self.root.limits),
                    "totals": dict(self.totals), "suspend": self.suspend,
                    "counts": {k: v for k, v in self.root.spent.items() if v},
                    "active_ms": self.now_ms - self.root.started_ms + self.active_before_ms}

    @classmethod
    def resume(cls, state: Mapping[str, Any], limits: Mapping[str, float],
               now_ms: float) -> Ledger:
        """A run that goes on from *state*: the saved and the given limits combine by minimum;
        nothing is reset; a run that suspends gets fresh windows within its totals (S3-1)."""
        saved = state["limits"]
        combined = {k: min(saved.get(k, INF), limits.get(k, INF))
                    for k in saved.keys() | limits.keys()}
        return cls(combined, suspend=state["suspend"], totals=state["totals"],
                   name=state["name"], now_ms=now_ms, counts=state["counts"],
                   active_ms=state["active_ms"])
