"""The ledger: what a run and its grants may spend and have spent (S2-2, S2-9, S3-1, S3-3,
S3-5, S4-3, S4-4, S4-8).

`Ledger` is the interface; `LocalLedger` keeps the counters in this process. What a ledger
kept on a cluster does besides (send a branch to a worker, keep the whole work's timeout on the
scheduler's clock) is `ClusterLedger`, reached through `Ledger.cluster` (None for a ledger kept
here): the run asks for it by capability, never by class. What every ledger reads of its
accounts against its limits (thresholds, approach notices, refusals, figures) is `Figures`,
which each ledger holds. A run's ledger is made by a `LedgerFactory`, chosen with
``nb.Budget(..., ledger=...)`` (`LocalLedger` by default, and itself a factory); a ledger kept
elsewhere comes from a factory bound to the place it lives (its class with a cluster's client,
say). A ledger holds one `Account` per run or grant: the run's account has the run-wide
counters, a grant's has its own allowances beside them (S2-2).
Check-and-reserve covers an account and its run's together, all or nothing (S4-3); a refusal
leaves every counter as it was and is recorded (S4-8). Spending that already happened is
counted even past a limit, and the first limit it passed is reported (S4-10, S3-3).

Leases: the local ledger reserves permits of each whole-number kind ahead, in blocks, into a
pool per kind, and ``step()`` or ``charge(kind)`` takes one with ``list.pop()``, which is atomic:
no lock, no clock. Everything else (a refill, an amount other than 1, a notice to give, a full
trace, a refusal, a grant) takes the lock. A used amount is ``counts - len(pool)``; a pool never
holds permits past the limit or the next notice. A ledger kept elsewhere (a scheduler) has the
same shape: a reservation settles a lease in the same round trip, and a stop drains the leases.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .clock import Clock
from .errors import BudgetExceeded, ConfigError
from .kinds import KIND_INDEX, KINDS, POOLED, RUN_MS, WINDOWS, kind_index
from .limits import NO_LIMITS, Limits
from .snapshot import AxisUsage
from .trace import Recorder

if TYPE_CHECKING:
    from .scope import Scope, Stop

__all__ = ["STATE_VERSION", "Account", "Branch", "ClusterLedger", "Figures", "Ledger",
           "LedgerFactory", "LocalLedger", "Worst", "check_totals", "plain", "read_state",
           "reserve_costed_in_steps", "reserve_in_steps"]

#: the version a run's saved state (`Budget.state`) carries, which `read_state` checks before a
#: run is resumed from it; `nbbudget.run.budget` offers it beside `Budget.resume`
STATE_VERSION = "nbbudget-ledger-v1"
_INF = math.inf
_K = len(KINDS)
_COST = KIND_INDEX["cost_usd"]
# permits a pool reserves at a time: the first block, doubled at each refill up to the last.
# A refill takes the lock, and threads that charge at once queue on it: one that waits for the
# lock is given it while it has no GIL, and every later refill then hands both over (a thread
# switch per refill, 4 threads at 0.6x the permits/s of one when the block stayed 256)
_BLOCK, _MAX_BLOCK = 256, 8192
_PERMITS: list[None] = [None] * _MAX_BLOCK
_ROOT_CAP = tuple(_INF if pooled else -_INF for pooled in POOLED)  # with no limit: pool freely
_NO_CAP = (-_INF,) * _K
_STATE_KEYS = ("name", "limits", "totals", "suspend", "counts", "active_ms", "notice_level",
               "notices")

#: (kind index, amount) pairs, in the attribution order
Items = Sequence[tuple[int, float]]


class Account:
    """What one run or grant may spend and has spent. A grant's pools stay empty: it always
    charges through the lock, on its own allowances and on its run's.

    The lists are indexed by kind (`nbbudget.core.kinds.KINDS`). They are the working state of
    the ledger that opened the account, which alone writes them, under its lock (a permit
    popped from a pool is the one write made without it); `limit_time` is the one change made
    from outside, when a grant is made. Nothing else writes an account.
    """

    def __init__(self, ledger: Ledger, name: str, limits: Limits, recorder: Recorder,
                 parent: Account | None) -> None:
        self.ledger = ledger
        self.name = name
        self.limits = limits
        self.limits_set = limits.to_dict()
        self.recorder = recorder
        self.parent = parent  # the run's account, for a grant's; None for the run's own
        self.scope = "run" if parent is None else "grant"
        # reserved so far, permits waiting in the pool included: used = counts - pool - base
        self.counts: list[float] = [0] * _K
        self.bulk: list[float] = [0] * _K  # amounts beyond one per charge: ops = used - bulk
        self.base: list[float] = [0] * _K  # what earlier windows used (S3-1)
        self.total: list[float | None] = [None] * _K  # a run's whole-run totals over windows
        # True once no unit can be had: a charge refuses without the lock. Never reset.
        self.exhausted = [False] * _K
        # permits reserved ahead, taken with list.pop(): never past thr, nor the next notice
        self.pools: list[list[None]] = [[] for _ in range(_K)]
        # the count that may be reached, base included: a grant's own allowances from the
        # start; a run's set by its ledger (`LocalLedger.arm`) from its limits and totals
        self.thr = [_INF] * _K
        if parent is not None:
            for kind, value in self.limits_set.items():
                self.thr[KIND_INDEX[kind]] = value
        self.watch = [_INF] * _K  # the use at which the next notice is due
        self.cap = list(_NO_CAP)  # how far the pool may reserve ahead
        self.block = [_BLOCK] * _K  # how many permits the pool's next refill reserves
        self.closed = False  # stopped: its pools stay empty, so no lock-free take succeeds

    def limit_time(self, left_ms: float) -> None:
        """Cap this grant's time at *left_ms*, what its parent has left when it is made: a
        grant never outlives its run (S2-1). `Core.grant` calls it, lock held."""
        self.thr[RUN_MS] = min(self.thr[RUN_MS], left_ms)

    def used(self, i: int) -> float:
        """What kind *i* has consumed in this slice (reserved, less what waits in the pool)."""
        return self.counts[i] - len(self.pools[i]) - self.base[i]

    def figures(self, i: int) -> tuple[float, float]:
        """The limit of kind *i* in force (this slice's), and what this slice consumed."""
        return plain(self.thr[i] - self.base[i]), plain(self.used(i))


@dataclass(frozen=True)
class Branch:
    """What a branch sent to a worker needs of its run: the run's key on the scheduler and the
    scope it charges (the run's, or a grant's), its name and limits, the time it has left
    (never a deadline: monotonic clocks do not compare across hosts) and its notices."""

    key: str
    home: str
    name: str
    limits: dict[str, float]
    remaining_ms: float | None
    notices: tuple[float, float] | None


class Ledger(Protocol):
    """What a run needs of the place its counters are kept. Amounts are ``(kind index,
    amount)`` pairs; an account is what `open` returned. The lock is held around `reserve`,
    `spend`, `check` and `drain` by the run, so a stop and a reservation never interleave.
    `LocalLedger` implements it here, a backend on a cluster's scheduler (`nbbudget.backends`);
    the run (`nbbudget.core.lowlevel.Core`) is its only caller."""

    @property
    def lock(self) -> threading.Lock:
        """The run's lock, the one its scope holds."""

    @property
    def root(self) -> Account:
        """The run's account (a grant's is opened under it)."""

    @property
    def suspend(self) -> bool:
        """Windows suspend the run (S3-1)."""

    @property
    def totals(self) -> Limits:
        """The whole-run totals over windows (S3-1)."""

    @property
    def notice_level(self) -> int:
        """The approach notices given so far (S3-5)."""

    @property
    def cluster(self) -> ClusterLedger | None:
        """What this ledger does on a cluster besides (`ClusterLedger`), or None for a ledger
        kept in this process: a run that sends a branch to a worker, or keeps a timeout on the
        scheduler, asks for it here."""

    def traced_pools(self, started: Any) -> None: ...

    def time_notices(self) -> list[float]: ...

    def notice(self, t_ms: float) -> None: ...

    def open(self, name: str, limits: Limits, recorder: Recorder,
             parent: Account) -> Account: ...

    def reserve(self, account: Account, items: Items, target: str | None,
                t_ms: float) -> BudgetExceeded | None: ...

    def reserve_within(self, account: Account, items: Items, i: int, target: str | None,
                       when: Callable[[], float]) -> float | BudgetExceeded:
        """`reserve` *items* unless kind *i* has less than one unit left (refused first, as
        `check` refuses it, and nothing is reserved); what is then left of kind *i*
        (`remaining`), else the refusal. `reserve_in_steps` does it with those three steps,
        for any ledger. *when* reads the trace's time (`Scope.t_ms`), only when an
        event is recorded: a model request's reservation mostly records none."""

    def reserve_costed(self, account: Account, items: Items, i: int, c: int, worst: Worst,
                       target: str | None, when: Callable[[], float]
                       ) -> tuple[float, float] | BudgetExceeded:
        """`reserve_within` for a model request whose dollars (kind *c*) are reserved too, at
        its *worst* case, its cap clamped to the output tokens (kind *i*) and the dollars left
        (S3-10); the cap and the dollars reserved, else the refusal (nothing reserved).
        `reserve_costed_in_steps` does it with `check`, `remaining`, `refuse` and `reserve`,
        for any ledger."""

    def spend(self, account: Account, items: Items, target: str | None,
              when: Callable[[], float]) -> list[tuple[Account, int]]:
        """Record spending that already happened (S4-10), even past a limit; the holders whose
        limit it passed, each with the first kind passed (S2-9, S3-3). *when* as for
        `reserve_within`."""

    def window(self, holder: Account, i: int) -> bool: ...

    def check(self, account: Account, i: int, n: float, target: str | None,
              t_ms: float) -> BudgetExceeded | None: ...

    def refuse(self, account: Account, holder: Account, i: int, n: float, target: str | None,
               t_ms: float) -> BudgetExceeded: ...

    def drain(self, account: Account) -> None: ...

    def remaining(self, account: Account, i: int) -> float: ...

    def consumed(self, account: Account) -> dict[str, float]: ...

    def axes(self, account: Account, elapsed_ms: float,
             remaining_ms: float | None) -> tuple[AxisUsage, ...]: ...

    def stats(self, refused: Counter[str]) -> dict[str, dict[str, float]]: ...

    def state(self, active_ms: float) -> dict[str, Any]: ...

    def restore(self, state: Mapping[str, Any]) -> None: ...

    def bind(self, scope: Scope) -> None:
        """The run's scope, when the run is made: a ledger kept elsewhere stops it when the run
        is stopped there (`LocalLedger` does nothing: no stop comes from elsewhere)."""

    def end(self, account: Account) -> None:
        """*account*'s run or grant ended (lock held): a ledger kept elsewhere gives back what
        it holds there (`LocalLedger` does nothing)."""


class ClusterLedger(Protocol):
    """What only a ledger kept on a cluster does: send a branch of the run to a worker, and
    keep the whole work's timeout on the scheduler's clock. A ledger that can gives it as
    `Ledger.cluster` (the Dask backend's ledger gives itself); a branch sent by a run on a
    cluster (`nbbudget.run.branches.parallel_on`) and a call's job on a cluster (the backend's
    runner) ask for it there."""

    def branch(self, account: Account, name: str, remaining_ms: float | None) -> Branch:
        """What a branch of *account* (the run or one of its grants) needs on a worker: the
        run opened on the scheduler, its place there, its limits and the time it has left."""

    def stop_after(self, ms: float, stop: Stop) -> None:
        """Have the scheduler stop the run with *stop* once *ms* have passed on its clock (a
        duration: clocks differ between machines), with or without this process (S0-6)."""

    def standing_stop(self) -> Mapping[str, Any] | None:
        """The stop the scheduler already has for the run, if any (a kernel that joins a run
        made elsewhere takes it)."""


class LedgerFactory(Protocol):
    """What makes the ledger of a new run, with its root account: `LocalLedger` is one. *clock*
    and *elapsed* are the run's (time notices, S3-5), *lock* the one its scope holds; *full*
    asks for each charge in the trace."""

    def __call__(self, name: str, limits: Limits, recorder: Recorder, *, clock: Clock,
                 lock: threading.Lock, suspend: bool, totals: Limits,
                 notices: tuple[float, float] | None, elapsed: Callable[[], float],
                 full: bool) -> Ledger: ...


class Figures:
    """What a run's accounts read against its limits, whichever ledger keeps their counts: the
    thresholds each kind may reach and the pool caps (`arm`), the approach notices (S3-5),
    the refusals with their figures (S4-8), and every figure a run reads (what is left, what
    was consumed, its axes, its statistics, its checkpoint state). `LocalLedger` holds one over
    the counts it keeps; a ledger on a cluster (`nbbudget.backends`) holds one over the counts
    it reads from the scheduler, and gives *refresh*, which brings them up to date before a figure
    is read (None: the counts are all here)."""

    def __init__(self, root: Account, *, clock: Clock, lock: threading.Lock, suspend: bool,
                 totals: Limits, notices: tuple[float, float] | None,
                 elapsed: Callable[[], float], full: bool,
                 refresh: Callable[[], None] | None = None) -> None:
        self.root = root
        self.refresh = refresh
        self.lock = lock
        self.suspend = suspend
        self.totals = totals
        self.notices = notices
        self.notice_level = 0  # approach notices given so far
        self.full = full  # each charge is traced
        self.clock = clock
        self.elapsed = elapsed
        self.totals_set = totals_set = totals.to_dict()
        root.total = [totals_set.get(k.name) for k in KINDS]

    def traced_pools(self, started: Any) -> None:
        """With ``trace="full"``: the run's pools record each permit they hand out."""
        root = self.root
        root.pools = [root.recorder.pool(i, self.clock, started) for i in range(_K)]

    # -- thresholds ------------------------------------------------------------------------------
    def arm(self) -> None:
        """Recompute the run's thresholds, notice points and pool caps per kind."""
        root, totals = self.root, self.totals_set
        thr, watch, cap = [_INF] * _K, [_INF] * _K, list(_ROOT_CAP)
        for name in root.limits_set.keys() | totals.keys():
            i = KIND_INDEX[name]
            window = root.limits_set.get(name)
            thr[i] = min(root.base[i] + window if window is not None else _INF,
                         totals.get(name, _INF))
            if window is not None and self.notices and self._notice_armed(i):
                watch[i] = root.base[i] + window * self.notices[self.notice_level]
            if POOLED[i]:
                cap[i] = min(thr[i], math.ceil(watch[i]) - 1 if watch[i] != _INF else _INF)
        root.thr, root.watch, root.cap = thr, watch, cap

    def _notice_armed(self, i: int) -> bool:
        return self.notice_level < 2 and not (self.suspend and i in WINDOWS)

    def restart(self, notice_level: int) -> None:
        """A run restored from a checkpoint (S4-4): the notices it had given, and its
        thresholds armed again over the counts its ledger took back."""
        self.notice_level = notice_level
        self.arm()

    def window(self, holder: Account, i: int) -> bool:
        """Whether *holder* passing kind *i* spends a window that suspends the run (S3-1): a
        run's tokens, cost or time, with suspend on, its whole-run total not passed."""
        if not (self.suspend and i in WINDOWS and holder is self.root):
            return False
        total = holder.total[i]
        return total is None or holder.used(i) + holder.base[i] <= total

    def check(self, account: Account, i: int, n: float, target: str | None,
              t_ms: float) -> BudgetExceeded | None:
        """The refusal of *n* of kind *i* by the first of *account* and its run that has not
        that much left, else None; nothing is reserved (a clamp before dispatch)."""
        if self.refresh is not None:
            self.refresh()
        for holder in (account,) if account is self.root else (account, self.root):
            if holder.used(i) + holder.base[i] + n > holder.thr[i]:
                return self.refuse(account, holder, i, n, target, t_ms)
        return None

    def refuse(self, account: Account, holder: Account, i: int, n: float, target: str | None,
               t_ms: float) -> BudgetExceeded:
        """Record a refusal of *n* of kind *i* against *holder* (charged from *account*) and
        return the error (safe with or without the lock: the trace takes events from any
        thread)."""
        used, base, total = holder.used(i), holder.base[i], holder.total[i]
        if total is not None and used + base + n > total:  # a whole-run total: loud (S3-1)
            limit, consumed, window = total, used + base, False
        else:
            limit, consumed = holder.thr[i] - base, used
            window = self.suspend and i in WINDOWS and holder is self.root
        account.recorder.refusal(i, limit, consumed, n, target, t_ms)
        kind = KINDS[i]
        # BaseException.__new__ stores the args; the Python __init__ would only add a call
        err = BudgetExceeded.__new__(BudgetExceeded, kind.name, limit, consumed, n, target,
                                     kind.code, holder.scope)
        if window:
            err.window = True
        return err

    # -- notices (S3-5) ---------------------------------------------------------------------------
    def notice(self, t_ms: float) -> None:
        """Give the approach notices now due (lock held)."""
        notices = self.notices
        if not notices or self.notice_level >= 2:
            return
        kind, ratio = self._highest_ratio()
        while self.notice_level < 2 and ratio >= notices[self.notice_level]:
            self.notice_level += 1
            self.root.recorder.add("approach_notice", t_ms, {
                "level": self.notice_level, "threshold": notices[self.notice_level - 1],
                "budget_kind": kind, "ratio": round(ratio, 6),
                "advice": "start converging" if self.notice_level == 1 else "deliver now",
            })
        self.arm()

    def _highest_ratio(self) -> tuple[str, float]:
        best, best_ratio = "", 0.0
        for kind, limit in self.root.limits_set.items():
            i = KIND_INDEX[kind]
            if self.suspend and i in WINDOWS:
                continue
            used = self.elapsed() if i == RUN_MS else self.root.used(i)
            if used / limit > best_ratio:
                best, best_ratio = kind, used / limit
        return best, best_ratio

    def time_notices(self) -> list[float]:
        """The active ms at which a time notice is still to come."""
        run_ms = self.root.limits.run_ms
        if not self.notices or run_ms is None or self.suspend:
            return []
        return [run_ms * frac for level, frac in enumerate(self.notices)
                if level >= self.notice_level]

    # -- reading --------------------------------------------------------------------------------
    def remaining(self, account: Account, i: int) -> float:
        """What is left of kind *i*: the smaller of *account*'s own and the run's (lock held)."""
        if self.refresh is not None:
            self.refresh()
        left = _left(account, i)
        return left if account is self.root else min(left, _left(self.root, i))

    def totals_used(self, account: Account) -> list[float]:
        """Every kind's use across windows (lock held)."""
        if self.refresh is not None:
            self.refresh()
        return [account.used(i) + account.base[i] for i in range(_K)]

    def consumed(self, account: Account) -> dict[str, float]:
        """What *account* has used of each charged kind, across windows."""
        with self.lock:
            used = self.totals_used(account)
        # dollars to the picodollar: a request's reservation and its settling (S3-10) add and
        # take back amounts whose float sum differs from the reply's cost in the last digits
        used[_COST] = round(used[_COST], 12)
        return {k.name: plain(used[i]) for i, k in enumerate(KINDS) if used[i] and i != RUN_MS}

    def axes(self, account: Account, elapsed_ms: float,
             remaining_ms: float | None) -> tuple[AxisUsage, ...]:
        """Each armed axis of *account* now; time figures in whole milliseconds."""
        if self.refresh is not None:
            self.refresh()
        axes = []
        for kind, limit in account.limits_set.items():
            i = KIND_INDEX[kind]
            if i == RUN_MS:  # whole milliseconds: what a person reads
                used: float = round(elapsed_ms - account.base[RUN_MS])
                left: float = round(remaining_ms or 0.0)
            else:
                used = account.used(i)
                with self.lock:
                    left = plain(self.remaining(account, i))
            axes.append(AxisUsage(kind, limit, plain(used), left, used / limit))
        return tuple(axes)

    def stats(self, refused: Counter[str]) -> dict[str, dict[str, float]]:
        """The run's checks, consumptions, amounts consumed and refusals (given), by kind
        (S4-9); kinds with nothing to show are left out."""
        root = self.root
        with self.lock:
            used = self.totals_used(root)
            ops = [round(used[i] - root.bulk[i]) for i in range(_K)]
        stats: dict[str, dict[str, float]] = {"checks": {}, "consumptions": {}, "consumed": {},
                                              "refusals": {}}
        for i, kind in enumerate(KINDS):
            name = kind.name
            for table, value in (("checks", ops[i] + refused[name]), ("consumptions", ops[i]),
                                 ("consumed", plain(used[i])), ("refusals", refused[name])):
                if value:
                    stats[table][name] = value
        return stats

    # -- state (S3-1, S4-4, S4-5) -----------------------------------------------------------------
    def state(self, active_ms: float) -> dict[str, Any]:
        """The counters a checkpoint must hold, with the limits, totals and notices."""
        root = self.root
        with self.lock:
            used = self.totals_used(root)
            return {
                "version": STATE_VERSION, "name": root.name, "limits": root.limits.to_dict(),
                "totals": self.totals.to_dict(), "suspend": self.suspend,
                "counts": {k.name: plain(used[i]) for i, k in enumerate(KINDS)
                           if used[i] and i != RUN_MS},
                "active_ms": plain(round(active_ms, 3)), "notice_level": self.notice_level,
                "notices": list(self.notices) if self.notices else None,
            }


class LocalLedger:
    """The counters of one run and its grants, in this process, under one lock: a `Ledger`
    (and, as its class, a `LedgerFactory`). It keeps the counts and the leases; what they read
    against the limits is its `Figures`."""

    #: kept in this process: nothing only a cluster does
    cluster: ClusterLedger | None = None

    def __init__(self, name: str, limits: Limits, recorder: Recorder, *, clock: Clock,
                 lock: threading.Lock, suspend: bool, totals: Limits,
                 notices: tuple[float, float] | None, elapsed: Callable[[], float],
                 full: bool) -> None:
        self.lock = lock
        self.suspend = suspend
        self.totals = totals
        self.root = root = Account(self, name, limits, recorder, None)
        self.figures = Figures(root, clock=clock, lock=lock, suspend=suspend, totals=totals,
                               notices=notices, elapsed=elapsed, full=full)
        self.figures.arm()

    @property
    def notice_level(self) -> int:
        """The approach notices given so far (S3-5)."""
        return self.figures.notice_level

    def traced_pools(self, started: Any) -> None:
        """With ``trace="full"``: the run's pools record each permit they hand out."""
        self.figures.traced_pools(started)

    def open(self, name: str, limits: Limits, recorder: Recorder,
             parent: Account) -> Account:
        """A grant's account under *parent* (lock held): its own allowances (S2-2)."""
        return Account(self, name, limits, recorder, parent)

    def bind(self, scope: Scope) -> None:
        """Nothing: no stop of this run comes from elsewhere."""

    def end(self, account: Account) -> None:
        """Nothing: this ledger holds nothing elsewhere."""

    # -- check and reserve (lock held) -------------------------------------------------------------
    def reserve(self, account: Account, items: Items, target: str | None,
                t_ms: float) -> BudgetExceeded | None:
        """Reserve every item on *account* and its run's counters, all or nothing (S4-3)."""
        root, figures = self.root, self.figures
        if account is not root:
            for i, n in items:
                if account.counts[i] + n > account.thr[i]:
                    return figures.refuse(account, account, i, n, target, t_ms)
        short = self._take_all(items)
        if short is not None:
            return figures.refuse(account, root, *short, target, t_ms)
        if account is not root:
            for i, n in items:
                account.counts[i] += n
        self._after_take(account, items, target, lambda: t_ms)
        return None

    def reserve_within(self, account: Account, items: Items, i: int, target: str | None,
                       when: Callable[[], float]) -> float | BudgetExceeded:
        """`reserve` *items* unless kind *i* has less than one unit left (refused first,
        nothing reserved); what is then left of kind *i*, else the refusal. A model request's
        reservation, before every attempt (`Core.reserve_within`).

        The run's own permits, one of each kind, come from its pools when each holds one (as a
        single charge's do without the lock; here under it, all or none): what `check`,
        `reserve` and `remaining` would do then, without their calls, whose cost is most of
        the time a model call adds. Anything else goes through them (`reserve_in_steps`).
        """
        root = self.root
        if account is root and not self.figures.full:
            pools = root.pools
            if root.counts[i] - len(pools[i]) + 1 <= root.thr[i] and _pop_permits(pools, items):
                # (a pool run dry is refilled by the next take, as after a charge)
                thr, base = root.thr[i], root.base[i]  # _left(root, i), inline:
                left = thr - base - (root.counts[i] - len(pools[i]) - base)
                return left if left > 0 else 0
        return reserve_in_steps(self, account, items, i, target, when())

    def reserve_costed(self, account: Account, items: Items, i: int, c: int, worst: Worst,
                       target: str | None, when: Callable[[], float]
                       ) -> tuple[float, float] | BudgetExceeded:
        """`Ledger.reserve_costed`. The run's own request, with no full trace, takes its permits
        from the pools, one of each kind, and its dollars inline, as `reserve_within` and
        `reserve` would (the dollars have no pool: their count, the consumption, the next
        notice), without their calls: the generic steps cost a request with ``cost_usd`` armed
        about 20 us more than one without (``benchmarks/bench_instrument.py``). Anything
        else, and every refusal, goes through `reserve_costed_in_steps`."""
        root = self.root
        if account is root and not self.figures.full:
            counts, pools, thr = root.counts, root.pools, root.thr
            # what `remaining` says of each, inline: the limit less what is used
            out_left = thr[i] - counts[i] + len(pools[i])
            dollars_left = thr[c] - counts[c]
            if out_left >= 1 and dollars_left > 0:
                cap, dollars, short = worst.fit(out_left, dollars_left)
                if not short and counts[c] + dollars <= thr[c] and _pop_permits(pools, items):
                    counts[c] += dollars
                    root.bulk[c] += dollars - 1  # one consumption, as `_take` counts it
                    if counts[c] - root.base[c] >= root.watch[c]:  # `_after_take`'s notice
                        self.figures.notice(when())
                    return cap, dollars
        return reserve_costed_in_steps(self, account, items, i, c, worst, target, when)

    def _take_all(self, items: Items) -> tuple[int, float] | None:
        """Reserve every item on the run, or none: the first that cannot be had, else None.
        Dollars get back their exact figures; pooled kinds give back by count."""
        root = self.root
        counts, bulks = root.counts, root.bulk
        before: list[tuple[float, float]] = []
        for i, n in items:
            count, bulk = counts[i], bulks[i]
            if not self._take(i, n):
                for (j, m), (count, bulk) in zip(items, before, strict=False):
                    if POOLED[j]:
                        counts[j] -= m
                        bulks[j] -= m - 1
                    else:
                        counts[j], bulks[j] = count, bulk
                return i, n
            before.append((count, bulk))
        return None

    def _take(self, i: int, n: float) -> bool:
        """Reserve *n* of kind *i*: from what is not yet reserved, then from the pool."""
        root = self.root
        counts, pool, thr = root.counts, root.pools[i], root.thr[i]
        taken = _from_pool(pool, counts[i] + n - thr)  # only what the limit leaves no room for
        if counts[i] + n - taken > thr:
            counts[i] -= taken  # what was taken from the pool is free again
            if POOLED[i] and not pool and thr - counts[i] < 1:
                root.exhausted[i] = True
            return False
        counts[i] += n - taken
        root.bulk[i] += n - 1
        return True

    def _after_take(self, account: Account, items: Items, target: str | None,
                    when: Callable[[], float]) -> None:
        """What follows a reservation or a spending of *items*: a full-trace event, a notice,
        a refill of the lease, for each kind in turn. First, the permits the pool holds past
        its cap go: a reservation or a spending of more than one unit counts on top of them,
        and a permit taken from the pool without the lock must never pass the limit or the
        next notice (S4-3, S3-5)."""
        root = self.root
        figures = self.figures
        counts, base, watch, cap, pools = root.counts, root.base, root.watch, root.cap, root.pools
        for i, n in items:
            if figures.full:
                account.recorder.charge(i, n, when(), target)
            pool, count = pools[i], counts[i]
            if pool and count > cap[i]:
                count = counts[i] = count - _from_pool(pool, count - cap[i])
            if count - len(pool) - base[i] >= watch[i]:  # root.used(i), inline
                figures.notice(when())
                watch, cap, count = root.watch, root.cap, counts[i]  # armed again
            room = cap[i] - count
            if room >= 1 and not pool and not root.closed:  # refill an empty pool only
                k = int(min(root.block[i], room))
                root.block[i] = min(2 * root.block[i], _MAX_BLOCK)
                counts[i] += k
                pool.extend(_PERMITS[:k])

    def drain(self, account: Account) -> None:
        """Give back the permits waiting in *account*'s pools and never refill them (a stop:
        lock held; pops may race, each is one)."""
        account.closed = True
        for i, pool in enumerate(account.pools):
            while True:
                try:
                    list.pop(pool)  # not a charge: a traced pool records nothing here
                except IndexError:
                    break
                account.counts[i] -= 1

    # -- after the fact and without reserving (lock held) ---------------------------------------
    def spend(self, account: Account, items: Items, target: str | None,
              when: Callable[[], float]) -> list[tuple[Account, int]]:
        """Record spending that already happened, even past a limit (S4-10); for *account*, then
        its run, the first kind whose limit it passed there, in the attribution order (S2-9,
        S3-3): a reply can pass its grant's allowance and its run's limit at once."""
        root = self.root
        counts, bulk = root.counts, root.bulk
        for i, n in items:
            if account is not root:
                account.counts[i] += n
            counts[i] += n
            bulk[i] += n - 1
        self._after_take(account, items, target, when)
        out = []
        for holder in (account,) if account is root else (account, root):
            thr, base, pools = holder.thr, holder.base, holder.pools
            for i, _ in items:
                # holder.used(i) + base[i], inline and in the same order of operations, so that
                # a float (dollars) rounds exactly as it did through the method
                if thr[i] != _INF and holder.counts[i] - len(pools[i]) - base[i] + base[i] \
                        > thr[i]:
                    out.append((holder, i))
                    break
        return out

    def window(self, holder: Account, i: int) -> bool:
        """Whether *holder* passing kind *i* spends a window that suspends the run (S3-1)."""
        return self.figures.window(holder, i)

    def check(self, account: Account, i: int, n: float, target: str | None,
              t_ms: float) -> BudgetExceeded | None:
        """The refusal of *n* of kind *i* by *account* or its run, else None (nothing is
        reserved: a clamp before dispatch)."""
        return self.figures.check(account, i, n, target, t_ms)

    def refuse(self, account: Account, holder: Account, i: int, n: float, target: str | None,
               t_ms: float) -> BudgetExceeded:
        """Record a refusal of *n* of kind *i* against *holder* and return the error (S4-8)."""
        return self.figures.refuse(account, holder, i, n, target, t_ms)

    # -- notices (S3-5) ---------------------------------------------------------------------------
    def notice(self, t_ms: float) -> None:
        """Give the approach notices now due (lock held)."""
        self.figures.notice(t_ms)

    def time_notices(self) -> list[float]:
        """The active ms at which a time notice is still to come."""
        return self.figures.time_notices()

    # -- reading --------------------------------------------------------------------------------
    def remaining(self, account: Account, i: int) -> float:
        """What is left of kind *i*: the smaller of *account*'s own and the run's (lock held)."""
        return self.figures.remaining(account, i)

    def consumed(self, account: Account) -> dict[str, float]:
        """What *account* has used of each charged kind, across windows."""
        return self.figures.consumed(account)

    def axes(self, account: Account, elapsed_ms: float,
             remaining_ms: float | None) -> tuple[AxisUsage, ...]:
        """Each armed axis of *account* now; time figures in whole milliseconds."""
        return self.figures.axes(account, elapsed_ms, remaining_ms)

    def stats(self, refused: Counter[str]) -> dict[str, dict[str, float]]:
        """The run's checks, consumptions, amounts consumed and refusals, by kind (S4-9)."""
        return self.figures.stats(refused)

    # -- state (S3-1, S4-4, S4-5) -----------------------------------------------------------------
    def state(self, active_ms: float) -> dict[str, Any]:
        """The counters a checkpoint must hold, with the limits, totals and notices."""
        return self.figures.state(active_ms)

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take back the counters of *state* (read with `read_state`); with suspend, the
        windows start fresh and the totals stay (S3-1)."""
        root = self.root
        for kind, value in state["counts"].items():
            root.counts[kind_index(kind, chargeable=True)] = value
        root.bulk = list(root.counts)  # what earlier slices consumed is not this run's work
        if self.suspend:
            root.base = [root.counts[i] if i in WINDOWS else 0 for i in range(_K)]
            root.base[RUN_MS] = float(state["active_ms"])  # a fresh time window (S3-1)
        self.figures.restart(int(state["notice_level"]))


def _pop_permits(pools: list[list[None]], items: Items) -> bool:
    """Take one permit of each kind of *items* (each an amount of 1) from the run's *pools*
    (lock held), all or none (S4-3): whether they were taken. `LocalLedger.reserve_within`
    and `LocalLedger.reserve_costed` take a model request's permits so, as a charge without
    the lock takes one."""
    taken = 0
    for j, n in items:
        if n != 1:
            break
        try:
            pools[j].pop()
        except IndexError:
            break
        taken += 1
    else:
        return True
    for j, _ in items[:taken]:
        pools[j].append(None)
    return False


def _from_pool(pool: list[None], n: float) -> int:
    """Take up to *n* permits from *pool* (a run's, lock held; only whole-number kinds have
    permits), one at a time, as a charge without the lock may take one meanwhile: how many it
    gave. Not charges of their own: a traced pool records none."""
    taken = 0
    while taken < n:
        try:
            list.pop(pool)
        except IndexError:
            break
        taken += 1
    return taken


def _left(account: Account, i: int) -> float:
    return max(0, account.thr[i] - account.base[i] - account.used(i))


@dataclass(frozen=True)
class Worst:
    """A model request's worst case (S3-10): *fixed* dollars for its input (bounded from above)
    and *rate* dollars for each output token of its cap, *asked* (``inf``: none asked). With
    *clamp*, the cap may be lowered so that the worst case fits what is left; without it (a
    framework's callback cannot change the cap it sends) a worst case that does not fit is
    refused whole. `nbbudget.core.lowlevel.Core.reserve_costed` makes one for
    `Ledger.reserve_costed`."""

    fixed: float
    rate: float
    asked: float
    clamp: bool = True

    def fit(self, out_left: float, dollars_left: float) -> tuple[float, float, float]:
        """The cap, the dollars its worst case reserves, and the dollars asked when it does not
        fit (then the cap is below one token, or the dollars are more than *dollars_left*),
        with *out_left* output tokens and *dollars_left* dollars left."""
        fixed, rate, asked = self.fixed, self.rate, self.asked
        cap = min(asked, out_left) if self.clamp else asked
        if cap == _INF:  # no cap to send: the output is bounded by nothing known, so the
            worst = dollars_left if rate > 0 else fixed  # worst case is all that is left
            return cap, worst, (0.0 if fixed + rate <= dollars_left else fixed + rate)
        if rate > 0 and self.clamp:
            affordable = math.floor((dollars_left - fixed) / rate)
            while affordable >= 1 and fixed + affordable * rate > dollars_left:
                affordable -= 1  # a quotient rounded up
            cap = min(cap, affordable)
        worst = fixed + cap * rate
        fits = worst <= dollars_left and (cap >= 1 or asked < 1)
        return cap, worst, (0.0 if fits else fixed + rate if self.clamp else worst)


def reserve_costed_in_steps(ledger: Ledger, account: Account, items: Items, i: int, c: int,
                            worst: Worst, target: str | None, when: Callable[[], float]
                            ) -> tuple[float, float] | BudgetExceeded:
    """`Ledger.reserve_costed` in steps (`Ledger.check`, `Ledger.remaining`, `Ledger.refuse`,
    `Ledger.reserve`), for any ledger: the Dask backend's and the general case of
    `LocalLedger`'s (lock held). A request with no output token left is refused by kind *i*
    (S2-9); one whose worst case the dollars cannot pay for, by kind *c*; the permits of *items*
    and the dollars are reserved together, in the attribution order (S3-3)."""
    t_ms = when()
    out_left = ledger.remaining(account, i)
    if out_left < 1:
        err = ledger.check(account, i, 1, target, t_ms)
        if err is not None:
            return err
    cap, dollars, short = worst.fit(out_left, ledger.remaining(account, c))
    if short:
        return ledger.check(account, c, short, target, t_ms) or ledger.refuse(
            account, account, c, short, target, t_ms)
    both = sorted((*items, (c, dollars)), key=_rank)
    err = ledger.reserve(account, both, target, t_ms)
    return err if err is not None else (cap, dollars)


def _rank(item: tuple[int, float]) -> int:
    return KINDS[item[0]].rank


def reserve_in_steps(ledger: Ledger, account: Account, items: Items, i: int,
                     target: str | None, t_ms: float) -> float | BudgetExceeded:
    """`Ledger.reserve_within` in its three steps (`Ledger.check`, `Ledger.reserve`,
    `Ledger.remaining`), for any ledger: the Dask backend's ledger and the general case of
    `LocalLedger`'s (lock held)."""
    err = ledger.check(account, i, 1, target, t_ms) or ledger.reserve(account, items, target,
                                                                      t_ms)
    return err if err is not None else ledger.remaining(account, i)


def read_state(state: object) -> Mapping[str, Any]:
    """*state* if it is a complete ledger state of this version; else a `ConfigError`, and the
    state is refused unchanged (S4-5)."""
    if not isinstance(state, Mapping):
        raise ConfigError(f"a ledger state is a mapping, not {type(state).__name__}")
    if state.get("version") != STATE_VERSION:
        raise ConfigError(f"ledger state version {state.get('version')!r} is not "
                          f"{STATE_VERSION!r}; it is refused unchanged "
                          f"(see: nbbudget explain S4-5)")
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
        raise ConfigError(f"ledger state lacks {', '.join(missing)}; it is refused unchanged")
    return state


def check_totals(totals: Limits | None, suspend: bool) -> Limits:
    """*totals* (whole-run totals over windows, S3-1) if they may be given with *suspend*,
    else a `ConfigError`. `nbbudget.run.budget` checks a run's ``totals=`` with it before the
    run's ledger is made."""
    if totals is None:
        return NO_LIMITS
    if not isinstance(totals, Limits):
        raise ConfigError(f"totals must be nb.Limits, not {type(totals).__name__}")
    if not suspend:
        raise ConfigError("totals= only applies with suspend=True (whole-run totals over windows)")
    return totals


def plain(x: float) -> float:
    """*x*, as an int when it is a whole float (``3.0`` reads ``3``)."""
    if isinstance(x, float) and x.is_integer() and x != _INF:
        return int(x)
    return x

