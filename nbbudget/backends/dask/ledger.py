"""The client half of the Dask ledger: a run whose counters live on a cluster's scheduler
(`nbbudget.backends.dask.scheduler`), from the kernel or from a task on a worker.

`DaskLedger` is a `Ledger` and a `ClusterLedger` (`nbbudget.core.ledger`): it holds the run's
`Figures` (thresholds, notices, refusals, figures), as `LocalLedger` does, over counts read from
the scheduler. It keeps the local ledger's pools, so ``step()`` and ``charge(kind)``
stay a lock-free ``list.pop()``: the pool *is* this holder's lease. When a pool runs dry, one
round trip settles the lease it held (its unused permits go back) and takes the next one, sized
by time: the block doubles while a lease lasts under `FAST_S` and halves when one lasts over
`SLOW_S`, and the scheduler gives less as the limit nears. Everything else (an amount other
than 1, several kinds at once, a grant's charge) is one reservation on the scheduler, all or
nothing over the run and the grant (S4-3), after this holder's own leases of those kinds are
settled in the same trip. A refusal comes from the scheduler, with its figures (S4-8).

What other holders (the kernel, each branch) have consumed is read from the scheduler when a
figure is asked for (``consumed``, ``remaining``, a snapshot); until a holder settles its lease,
its unused permits count as consumed there. A stop of the run anywhere (a cancel in another
process, the whole work's timeout on the scheduler's clock) reaches this run through the stop
messages of the ledger, or at its next reservation at the latest.

Windows with ``suspend=True`` (S3-1) are not kept on a cluster: such a run is refused.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from ...core.clock import Clock
from ...core.errors import BudgetExceeded, ConfigError
from ...core.kinds import KIND_INDEX, KINDS, POOLED, RUN_MS, STEPS, kind_index
from ...core.ledger import (
    Account,
    Branch,
    ClusterLedger,
    Figures,
    Items,
    Ledger,
    LedgerFactory,
    Worst,
    reserve_costed_in_steps,
    reserve_in_steps,
)
from ...core.limits import Limits
from ...core.outcome import Status
from ...core.scope import Scope, Stop
from ...core.snapshot import AxisUsage
from ...core.trace import Recorder

if TYPE_CHECKING:
    from distributed import Client

    from .scheduler import Channel, Reply

__all__ = ["FAST_S", "RETRIED_ONCE", "SLOW_S", "WAIT_S", "Branch", "DaskAccount", "DaskLedger",
           "OnCluster", "how_of", "joining", "on_cluster", "told_stop", "watching"]

_K = len(KINDS)
#: the kinds a retried task is charged once for (see `DaskLedger.rid`)
RETRIED_ONCE = frozenset({STEPS})
#: a lease that lasted less than this doubles the next one; more than `SLOW_S` halves it
FAST_S, SLOW_S = 0.02, 0.2
FIRST_BLOCK, MAX_BLOCK = 64, 1 << 17
#: how long a refusal waits for other holders' leases to be settled
WAIT_S = 2.0
#: one client per scheduler address, and one factory per client, for this process (a run made
#: with ``cluster="tcp://..."`` reuses the connection, as Dask's own default client does)
_factories: weakref.WeakKeyDictionary[Client, OnCluster] = weakref.WeakKeyDictionary()
_factories_lock = threading.Lock()  # the connection thread makes one too (`connect`)


def joining(branch: Branch) -> LedgerFactory:
    """The ledger factory of a branch's run, in a task on a worker: it charges the scheduler's
    scope of *branch*, with ids that follow the task and its attempt."""
    from distributed import get_worker

    from .scheduler import Channel

    channel, task = Channel.here(), get_worker().get_current_task()
    attempt = int(channel.call("nbb_attempt", key=task)["attempt"]) if task is not None else 0

    def make(name: str, limits: Limits, recorder: Recorder, **kwargs: Any) -> DaskLedger:
        return DaskLedger(name, limits, recorder, **kwargs, channel=channel, branch=branch,
                          task=None if task is None else str(task), attempt=attempt)

    return make


def watching(client: Client, branch: Branch) -> LedgerFactory:
    """The ledger factory of a run that a kernel joins through *client* (a kernel that found a
    job's task on the scheduler): it reads the counters of *branch*'s run, and its stop stops
    that run there, which is pushed to the task; it never opens or closes the run."""
    from .scheduler import Channel

    channel = Channel.of(client)

    def make(name: str, limits: Limits, recorder: Recorder, **kwargs: Any) -> DaskLedger:
        return DaskLedger(name, limits, recorder, **kwargs, channel=channel, branch=branch)

    return make


class DaskAccount(Account):
    """A run's or grant's account whose counts are kept on the scheduler, under *key*.
    ``remote`` is the scheduler's count as last seen (every holder, unused leases included);
    this holder's own unused permits are the ones in its pools."""

    def __init__(self, ledger: DaskLedger, name: str, limits: Limits, recorder: Recorder,
                 parent: Account | None, key: str) -> None:
        super().__init__(ledger, name, limits, recorder, parent)
        self.key = key
        self.remote: list[float] = [0] * _K
        self.lease: list[str | None] = [None] * _K  # the open lease of each pooled kind
        self.block = [FIRST_BLOCK] * _K  # a lease's size, grown and shrunk by time (`lease`)
        self.leased_at = [0.0] * _K

    def used(self, i: int) -> float:
        return self.remote[i] - len(self.pools[i]) - self.base[i]

    def chain(self) -> list[DaskAccount]:
        """This account, then each one above it."""
        out: list[DaskAccount] = []
        a: Account | None = self
        while a is not None:
            assert isinstance(a, DaskAccount)
            out.append(a)
            a = a.parent
        return out

    def taken(self, i: int, n: float, bulk: float) -> None:
        """*n* of kind *i* were reserved here (*bulk* beyond one per charge)."""
        for a in self.chain():
            a.remote[i] += n
            a.bulk[i] += bulk

    def give_back(self, i: int) -> list[Any] | None:
        """Empty the pool of kind *i*: ``[lease id, unused]`` to settle, if a lease is open
        (lock held; a pop that races is one permit used)."""
        lease, pool, unused = self.lease[i], self.pools[i], 0
        if lease is None:
            return None
        while True:
            try:
                list.pop(pool)  # not a charge: a traced pool records nothing here
            except IndexError:
                break
            unused += 1
        self.lease[i] = None
        for a in self.chain():
            a.remote[i] -= unused
        return [lease, unused]


class DaskLedger:
    """The counters of one run and its grants, on a cluster's scheduler; see the module. A
    `Ledger`, and its own `cluster` (a `ClusterLedger`): it sends branches to workers and keeps
    the whole work's timeout on the scheduler."""

    #: windows that suspend the run are not kept on a cluster (the constructor refuses them)
    suspend = False

    def __init__(self, name: str, limits: Limits, recorder: Recorder, *, clock: Clock,
                 lock: threading.Lock, suspend: bool, totals: Limits,
                 notices: tuple[float, float] | None, elapsed: Callable[[], float],
                 full: bool, channel: Channel, branch: Branch | None = None,
                 task: str | None = None, attempt: int = 0) -> None:
        if suspend:
            raise ConfigError("suspend=True is not kept on a cluster's ledger; run it without "
                              "cluster=, or without suspend")
        self.lock = lock
        self.totals = totals
        self.channel = channel
        self.key = branch.key if branch is not None else f"nbb-run-{uuid.uuid4().hex}"
        self.holder = f"{channel.address}#{task or uuid.uuid4().hex[:12]}:{attempt}"
        home = branch.home if branch is not None else self.key
        self.root = self.home = DaskAccount(self, name, limits, recorder, None, home)
        self.figures = Figures(self.home, clock=clock, lock=lock, suspend=False, totals=totals,
                               notices=notices, elapsed=elapsed, full=full, refresh=self.refresh)
        self.home.total = [None] * _K
        self.accounts: dict[str, DaskAccount] = {home: self.home}
        self.restored: dict[str, float] = {}
        self.owner = branch is None  # this ledger opened the run (it is no branch of it)
        self.opened, self.ended = not self.owner, False
        self.scope: Scope | None = None
        self.origin: Scope | None = None
        self.unwatch: Callable[[], None] | None = None
        self.task, self.attempt = task, attempt
        self.timer: dict[str, Any] = {}  # the timer the run is opened with (`stop_after`)
        self._rids = [itertools.count(1) for _ in range(_K)]
        self.figures.arm()

    @property
    def cluster(self) -> ClusterLedger:
        """This ledger: it does what only a cluster does (`ClusterLedger`)."""
        return self

    @property
    def notice_level(self) -> int:
        """The approach notices given so far (S3-5), each given here as the scheduler reaches it."""
        return self.figures.notice_level

    def traced_pools(self, started: Any) -> None:
        """With ``trace="full"``: the run's pools record each permit they hand out."""
        self.figures.traced_pools(started)

    def time_notices(self) -> list[float]:
        """The active ms at which a time notice is still to come."""
        return self.figures.time_notices()

    def notice(self, t_ms: float) -> None:
        """Give the approach notices now due (lock held)."""
        self.figures.notice(t_ms)

    # -- the link to the scheduler -------------------------------------------------------------
    def ensure_open(self) -> None:
        """Open the run on the scheduler (again: it only narrows the limits there)."""
        if self.opened:
            return
        root = self.home
        limits = {k: v for k, v in root.limits_set.items() if k != KINDS[RUN_MS].name}
        self.call("nbb_open", scope=self.key, limits=limits, counts=self.restored or None,
                  notices=list(notices) if (notices := self.figures.notices) else None,
                  **self.timer)
        self.opened = True

    def call(self, op: str, **kwargs: Any) -> Reply:
        return self.channel.call(op, run=self.key, **kwargs)

    def rid(self, i: int) -> str:
        """The id of this holder's next reservation of kind *i*. In a task, ids follow the
        task's key, so that a retry of the task (its worker died) sends the same ids for the
        kinds in `RETRIED_ONCE` (charged once: the retry re-does the same steps) and new ones,
        with the attempt, for the rest (what a dead attempt spent was real)."""
        n = next(self._rids[i])
        if self.task is None:
            return f"{self.holder}:{KINDS[i].name}:{n}"
        attempt = 0 if i in RETRIED_ONCE else self.attempt
        return f"{self.task}:{attempt}:{KINDS[i].name}:{n}"

    def branch(self, account: Account, name: str, remaining_ms: float | None) -> Branch:
        """What a branch of *account* (this run or one of its grants) needs on a worker."""
        assert isinstance(account, DaskAccount)
        self.ensure_open()
        limits = {k: v for k, v in account.limits_set.items() if k != KINDS[RUN_MS].name}
        return Branch(self.key, account.key, name, limits, remaining_ms, self.figures.notices)

    def bind(self, scope: Scope) -> None:
        """Stop *scope* (the run's) when the scheduler says the run stopped; a kernel joining
        a run made elsewhere (`watching`) takes the stop it had already, too."""
        self.scope = scope
        self.unwatch = self.channel.on_stop(self.key, self.heard_stop)
        stopped = self.standing_stop() if not self.owner and self.task is None else None
        if stopped is not None:
            scope.halt(self.stop_of(scope, stopped))

    def heard_stop(self, scope: str, stop: Mapping[str, Any]) -> None:
        """A stop pushed by the scheduler (on the event loop): the run stops, off the loop. A
        grant's stop is its own business here (it stopped in this process)."""
        target = self.scope
        if target is None or target.stop is not None or scope not in (self.key, self.home.key):
            return
        threading.Thread(target=target.halt, args=(self.stop_of(target, stop),),
                         name="nbbudget-dask-stop", daemon=True).start()

    def stop_of(self, scope: Scope, stop: Mapping[str, Any]) -> Stop:
        """The stop the scheduler told of, as this run's: made here when this ledger opened the
        run, else (a branch) the run's own, made elsewhere, so a branch that returns anyway
        is not an error and one that does not is stopped as the run was."""
        return told_stop(scope if self.owner else self.elsewhere(scope), stop)

    def elsewhere(self, scope: Scope) -> Scope:
        """The run this branch belongs to, as a scope: where its stops come from."""
        if self.origin is None:
            self.origin = Scope(scope.name, scope.recorder, scope.clock)
        return self.origin

    def stopped(self, reply: Reply) -> NoReturn:
        """The scheduler refused because the run stopped elsewhere (lock held): stop it here."""
        scope = self.scope
        if scope is None:
            raise ConfigError(f"{self.home.name} was stopped on the cluster "
                              f"({reply['stopped']['cause']})")
        scope.halt_locked(self.stop_of(scope, reply["stopped"]))
        assert scope.stop is not None
        raise scope.stop.signal()

    def end(self, account: Account) -> None:
        """*account* ended here (lock held): its leases go back. When it is the run and this
        ledger opened it, its last figures are kept and the scheduler forgets it."""
        if account is not self.home or self.ended:
            return
        if self.unwatch is not None:
            self.unwatch()
            self.unwatch = None
        if self.opened:
            self.settle_all(self.home)
            self.refresh()
            if self.owner:
                self.mirror(self.call("nbb_close")["journal"])
        self.ended = True

    def mirror(self, journal: list[dict[str, Any]]) -> None:
        """The scheduler's journal of the run (every holder's refusals, notices, stops, leases
        lost with a worker), as ``ledger`` events of its trace, in their numbered order."""
        t_ms = self.scope.t_ms() if self.scope is not None else 0.0
        for entry in journal:
            self.home.recorder.add("ledger", t_ms, {k: v for k, v in entry.items() if k != "t"})

    # -- grants -------------------------------------------------------------------------------
    def open(self, name: str, limits: Limits, recorder: Recorder,
             parent: Account) -> Account:
        """A grant's account under *parent*, opened on the scheduler (lock held, S2-2)."""
        assert isinstance(parent, DaskAccount)
        self.ensure_open()
        account = DaskAccount(self, name, limits, recorder, parent,
                              f"{parent.key}/{name}#{uuid.uuid4().hex[:8]}")
        limits_set = {k: v for k, v in account.limits_set.items() if k != KINDS[RUN_MS].name}
        self.call("nbb_open", scope=account.key, parent=parent.key, limits=limits_set)
        self.accounts[account.key] = account
        return account

    # -- check and reserve (lock held) -------------------------------------------------------------
    def reserve(self, account: Account, items: Items, target: str | None,
                t_ms: float) -> BudgetExceeded | None:
        """Reserve *items* on the scheduler, all or nothing over *account* and its run (S4-3):
        a lease when it is one permit of a pooled kind of the run, else one reservation."""
        assert isinstance(account, DaskAccount)
        self.ensure_open()
        if len(items) == 1 and items[0][1] == 1 and POOLED[items[0][0]] and (
                account is self.home and not account.closed):
            return self.lease(items[0][0], target, t_ms)
        settle = [s for i, _ in items if (s := self.home.give_back(i)) is not None]
        reply = self.call("nbb_reserve", scope=account.key, rid=self.rid(items[0][0]),
                          holder=self.holder, items=[[KINDS[i].name, n] for i, n in items],
                          settle=settle,
                          wait_s=WAIT_S)
        if not reply["ok"]:
            return self.refusal(account, reply, items, target, t_ms)
        for i, n in items:
            account.taken(i, n, n - 1)
            if self.figures.full:
                account.recorder.charge(i, n, t_ms, target)
        self.heard_level(reply, t_ms)
        return None

    def reserve_within(self, account: Account, items: Items, i: int, target: str | None,
                       when: Callable[[], float]) -> float | BudgetExceeded:
        """`reserve` *items* unless kind *i* has less than one unit left on the scheduler
        (refused first, nothing reserved); what is then left of kind *i*, else the refusal."""
        return reserve_in_steps(self, account, items, i, target, when())

    def reserve_costed(self, account: Account, items: Items, i: int, c: int, worst: Worst,
                       target: str | None, when: Callable[[], float]
                       ) -> tuple[float, float] | BudgetExceeded:
        """A model request's permits and its worst case's dollars (S3-10), on the scheduler,
        in steps (`reserve_costed_in_steps`)."""
        return reserve_costed_in_steps(self, account, items, i, c, worst, target, when)

    def lease(self, i: int, target: str | None, t_ms: float) -> BudgetExceeded | None:
        """Settle the run's lease of kind *i* and take the next, in one round trip; one of its
        permits is this charge, the rest go to the pool."""
        root = self.home
        settle = root.give_back(i)
        now = time.monotonic()
        lasted, root.leased_at[i] = now - root.leased_at[i], now
        block = root.block[i]
        root.block[i] = (min(2 * block, MAX_BLOCK) if lasted < FAST_S
                         else max(1, block // 2) if lasted > SLOW_S else block)
        rid, name = self.rid(i), KINDS[i].name
        reply = self.call("nbb_reserve", scope=root.key, rid=rid, holder=self.holder,
                          items=[[name, root.block[i]]], lease=True,
                          settle=[settle] if settle else [], wait_s=WAIT_S)
        if not reply["ok"]:
            return self.refusal(root, reply, ((i, 1),), target, t_ms)
        granted = int(reply["granted"][0][1])
        root.lease[i] = f"{rid}/{name}"
        root.taken(i, granted, 0)
        root.pools[i].extend([None] * (granted - 1))
        if self.figures.full:
            root.recorder.charge(i, 1, t_ms, target)
        self.heard_level(reply, t_ms)
        return None

    def settle_all(self, account: DaskAccount) -> None:
        """Give back every open lease of *account* (lock held)."""
        settle = [s for i in range(_K) if (s := account.give_back(i)) is not None]
        if settle:
            self.call("nbb_settle", settle=settle)

    def refusal(self, account: DaskAccount, reply: Reply, items: Items, target: str | None,
                t_ms: float) -> BudgetExceeded:
        """The scheduler's refusal as this run's error, traced with its figures (S4-8)."""
        if "stopped" in reply:
            self.stopped(reply)
        if "unknown" in reply:
            raise ConfigError(f"{account.name} charges a run the cluster no longer has: it ended, "
                              f"or the scheduler restarted")
        i = KIND_INDEX[reply["kind"]]
        n = next((m for j, m in items if j == i), reply["amount"])
        holder = self.accounts.get(reply["scope"], account)
        holder.remote[i] = reply["consumed"] - len(holder.pools[i])
        limit, consumed = reply["limit"], reply["consumed"] - len(holder.pools[i])
        if reply.get("final") and POOLED[i] and holder is account and limit - consumed < 1:
            account.exhausted[i] = True  # nothing can free a unit: later refusals stay local
        account.recorder.refusal(i, limit, consumed, n, target, t_ms)
        kind = KINDS[i]
        return BudgetExceeded(kind.name, limit, consumed, n, target, kind.code,
                              "grant" if reply["grant"] else "run")

    def heard_level(self, reply: Reply, t_ms: float) -> None:
        """Give the approach notices the scheduler reached (S3-5), with fresh figures."""
        if reply.get("notice_level", 0) > self.figures.notice_level:
            self.refresh()
            self.figures.notice(t_ms)

    def drain(self, account: Account) -> None:
        """A stop (lock held): the pools empty and never refill, the leases go back, and the
        scope is stopped on the scheduler too, so every holder hears of it."""
        assert isinstance(account, DaskAccount)
        account.closed = True
        if self.opened and not self.ended:
            self.settle_all(account)
            stop = self.scope.stop if self.scope is not None and account is self.home else None
            self.call("nbb_cancel", scope=account.key, how=None if stop is None else how_of(stop),
                      reason=None if stop is None or stop.reason is None else str(stop.reason))

    # -- after the fact and without reserving (lock held) ---------------------------------------
    def spend(self, account: Account, items: Items, target: str | None,
              when: Callable[[], float]) -> list[tuple[Account, int]]:
        """Count spending that already happened on the scheduler, even past a limit (S4-10);
        the scopes whose limit it passed, each with the first kind passed (S2-9, S3-3)."""
        assert isinstance(account, DaskAccount)
        self.ensure_open()
        t_ms = when()
        reply = self.call("nbb_spend", scope=account.key, rid=self.rid(items[0][0]),
                          items=[[KINDS[i].name, n] for i, n in items])
        for i, n in items:
            account.taken(i, n, n - 1)
            if self.figures.full:
                account.recorder.charge(i, n, t_ms, target)
        passed: list[tuple[Account, int]] = []
        for key, kind, _limit, consumed in reply["passed"]:
            holder, i = self.accounts[key], KIND_INDEX[kind]
            holder.remote[i] = consumed - len(holder.pools[i])
            passed.append((holder, i))
        self.heard_level(reply, t_ms)
        return passed

    def window(self, holder: Account, i: int) -> bool:
        """Never: windows that suspend a run are not kept on a cluster (S3-1)."""
        return self.figures.window(holder, i)

    def check(self, account: Account, i: int, n: float, target: str | None,
              t_ms: float) -> BudgetExceeded | None:
        """The refusal of *n* of kind *i* by *account* or its run, by the scheduler's counts
        read now, else None (nothing is reserved: a clamp before dispatch)."""
        return self.figures.check(account, i, n, target, t_ms)

    def refuse(self, account: Account, holder: Account, i: int, n: float, target: str | None,
               t_ms: float) -> BudgetExceeded:
        """Record a refusal of *n* of kind *i* against *holder* and return the error (S4-8)."""
        return self.figures.refuse(account, holder, i, n, target, t_ms)

    # -- reading ----------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Read every account's counts from the scheduler (after the run ended here, its last
        figures stay). Its `Figures` call it before a figure is read."""
        if not self.opened or self.ended:
            return
        reply = self.call("nbb_snapshot")
        if not reply["ok"]:  # the run ended on the scheduler: the last figures stay
            return
        scopes = reply["scopes"]
        for key, account in self.accounts.items():
            figures = scopes.get(key)
            if figures is None:
                continue
            account.remote = [figures["counts"].get(k.name, 0) for k in KINDS]
            account.bulk = [figures["bulk"].get(k.name, 0) for k in KINDS]

    def remaining(self, account: Account, i: int) -> float:
        """What is left of kind *i* on the scheduler: *account*'s own or the run's, the
        smaller (lock held)."""
        return self.figures.remaining(account, i)

    def consumed(self, account: Account) -> dict[str, float]:
        """What *account* has used of each charged kind, by every holder, on the scheduler."""
        return self.figures.consumed(account)

    def axes(self, account: Account, elapsed_ms: float,
             remaining_ms: float | None) -> tuple[AxisUsage, ...]:
        """Each armed axis of *account* now, by the scheduler's counts."""
        return self.figures.axes(account, elapsed_ms, remaining_ms)

    def stats(self, refused: Counter[str]) -> dict[str, dict[str, float]]:
        """The run's checks, consumptions, amounts consumed and refusals, by kind (S4-9)."""
        return self.figures.stats(refused)

    # -- state (S4-4) -----------------------------------------------------------------------------
    def state(self, active_ms: float) -> dict[str, Any]:
        """The counters a checkpoint must hold, as the scheduler has them now."""
        return self.figures.state(active_ms)

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take back the counters of *state*: the run opens on the scheduler with them."""
        if self.opened:
            raise ConfigError("a cluster's run takes a saved state before its first charge")
        self.restored = {kind: value for kind, value in state["counts"].items()
                         if kind_index(kind, chargeable=True) is not None}
        for kind, value in self.restored.items():
            self.home.remote[KIND_INDEX[kind]] = value
        self.home.bulk = list(self.home.remote)
        self.figures.restart(int(state["notice_level"]))

    # -- what only a cluster does (`ClusterLedger`) ---------------------------------------------
    def stop_after(self, ms: float, stop: Stop) -> None:
        """Have the scheduler stop this run with *stop* once *ms* have passed on its clock (a
        duration: clocks differ between machines), with or without this process: the whole
        work's wall-clock limit (S0-6), kept by a call's job on a cluster
        (`nbbudget.backends.dask.runner.DaskRunner.start`). Sent with the run's opening, or
        now if it is open."""
        self.timer = {"timeout_ms": ms, "how": how_of(stop)}
        if self.opened:  # (opening again only arms the timer, if the run has none yet)
            self.call("nbb_open", scope=self.key, limits={}, **self.timer)

    def standing_stop(self) -> Mapping[str, Any] | None:
        """The stop the scheduler already has for this run, if any: a kernel that joins a run
        made elsewhere (`watching`) takes it when it binds its scope."""
        reply = self.call("nbb_snapshot")
        figures = reply["scopes"].get(self.home.key) if reply["ok"] else None
        return figures["stopped"] if figures is not None else None


def how_of(stop: Stop) -> dict[str, Any]:
    """*stop* as the ledger's stop messages carry it (`told_stop` makes it again)."""
    return {"status": stop.status.value, "message": stop.message, "by": stop.by,
            "code": stop.code}


def told_stop(origin: Scope, stop: Mapping[str, Any]) -> Stop:
    """The `Stop` of *origin* that the ledger's message *stop* tells of."""
    reason, how = stop.get("reason"), stop.get("how")
    if how is not None:
        return Stop.of(Status(how["status"]), how["message"], origin, by=how["by"],
                       code=how["code"], reason=reason)
    if stop.get("cause") == "timeout":
        return Stop.of(Status.FAILED, f"{origin.name} ran out of time: the whole work's timeout "
                       f"passed on the cluster's clock", origin, by="timeout",
                       code=KINDS[RUN_MS].code)
    message = f"{origin.name} was stopped" + (f": {reason}" if reason is not None else "")
    return Stop.of(Status.STOPPED, message, origin, reason=reason)


def on_cluster(cluster: object, within_s: float | None = None,
               budget_ms: int | None = None) -> OnCluster:
    """The ledger factory of *cluster*: a ``distributed.Client``, or a scheduler address (one
    client per address, kept for this process; a first connection waits at most *within_s*,
    what is left of a call budget of *budget_ms*: `client_of`)."""
    from .connect import client_class, client_of

    if isinstance(cluster, str):  # connected (Dask imported) on a thread of its own
        cluster = client_of(cluster, _factory, within_s, budget_ms)
    if not isinstance(cluster, client_class()):
        raise ConfigError(f"cluster= takes a distributed.Client or a scheduler address, not "
                          f"{type(cluster).__name__}")
    return _factory(cluster)


def _factory(client: Client) -> OnCluster:
    """The ledger factory of *client*, made (its extension installed) on first use."""
    with _factories_lock:
        factory = _factories.get(client)
        if factory is None:
            factory = _factories[client] = OnCluster(client)
        return factory


class OnCluster:
    """The ledger factory of runs on a cluster (``nb.budget(..., cluster=client)``): each run
    it makes keeps its counters on the scheduler of *client*, installed there on first use."""

    __name__ = "DaskLedger"

    def __init__(self, client: Client) -> None:
        from .scheduler import Channel, install

        install(client)
        self.client = client
        self.channel = Channel.of(client)

    def __call__(self, name: str, limits: Limits, recorder: Recorder, *, clock: Clock,
                 lock: threading.Lock, suspend: bool, totals: Limits,
                 notices: tuple[float, float] | None, elapsed: Callable[[], float],
                 full: bool) -> DaskLedger:
        return DaskLedger(name, limits, recorder, clock=clock, lock=lock, suspend=suspend,
                          totals=totals, notices=notices, elapsed=elapsed, full=full,
                          channel=self.channel)


if TYPE_CHECKING:  # checked by mypy --strict: a DaskLedger is a Ledger and a ClusterLedger,
    # and OnCluster (like the factories of `joining` and `watching`) a LedgerFactory
    _LEDGER: type[Ledger] = DaskLedger
    _CLUSTER_LEDGER: type[ClusterLedger] = DaskLedger
    _FACTORY: type[LedgerFactory] = OnCluster
