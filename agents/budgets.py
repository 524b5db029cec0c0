"""Prices, costs and budgets: what a run cost, and the ceilings on an API key's or an agent's tokens and cost.

**Reservation.** A budget holds per period (UTC day or month) a counter row (``BudgetUsage``): ``used`` (settled
runs) and ``reserved`` (runs in flight). Admitting a run (``budget_reserve``, inside ``run_create``'s transaction)
adds the budget's ``run_reservation_tokens`` (and their cost at the dearest token price of the run's model, a
price the reservation keeps with that model, at which the run is charged while it runs that model:
``run_price``) to ``reserved`` with one conditional ``UPDATE … WHERE used + reserved + reservation <= limit``;
when no row is updated the run is refused (``429 budget_exceeded``: ``Retry-After`` until the period ends where
its spend leaves no room, a few seconds where the reservations of runs in flight hold it, or until the first
approval expires where runs parked awaiting approval alone hold it) and the transaction
rolls back any other budget's reservation. The condition is evaluated by the database on the row
it updates (PostgreSQL re-checks it after taking the row lock; SQLite writes one transaction at a time), so
concurrent admissions can never reserve more than the limit together. When the run ends (``budget_settle``, once,
by compare-and-swap on the reservation) its reservation is released and its real tokens and cost are added to
``used``, on the row it reserved on: the period it was admitted in, or the budget's new period where an admin
changed the period while it was in flight (``budget_update`` carries open reservations to the new period's row).
A budget's creation, a change of its period and switching it on count on the period's counters what its API key or
agent spent in the period so far, and reserve there for its runs in flight admitted without it (``_usage_open``); a
model without a price under a cost limit is refused (``409 budget_misconfigured``), never free.

**The bound.** Before each model call the engine caps the call to what is left of the run's reservation
(``agents.engine.input_token_bound`` bounds its input; ``max_tokens`` caps its output; a call whose input bound
does not fit is not made: ``budget:run_ceiling``; a call whose provider reports no usage is charged that input
bound and its output counted the same way, at most its ``max_tokens``: ``agents.engine.usage_estimate``), so a run
never spends more than its reservation and the period's spend never exceeds the limit (given the input bound, one
token per UTF-8 byte, holds), unless the run's agent was switched to a dearer model after the run was admitted:
such a run is charged what that model costs (``run_price``), past its reservation's cost if need be. A run
cancelled while a live worker holds it keeps its reservation until that worker stops (a model call it has out
spends up to what the reservation allows) or the reconciler finds its time up (``agents.services.run_cancel``).
"""

from __future__ import annotations

import calendar
import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import (
    BigIntegerField,
    Case,
    Count,
    F,
    Min,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest, TruncDate
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.translation import gettext as _

from agent_platform.errors import ApplicationError
from agents.models import MICROS_PER_USD as MICROS_PER_USD
from agents.models import (
    RUN_IN_FLIGHT_STATUSES,
    UNPAID_PROVIDERS,
    Agent,
    ApiKey,
    Approval,
    Budget,
    BudgetReservation,
    BudgetUsage,
    ModelPrice,
    Run,
    RunEvent,
    version_model,
)
from agents.models import model_price_for as model_price_for
from agents.models import reservation_cost_micros as _reservation_cost_micros
from agents.models import usd_text as usd_text
from audit.changes import audited_delete, audited_save
from mcpregistry.models import INT32_MAX

# ``MICROS_PER_USD``, ``usd_text``, ``model_price_for`` and the reservation's cost are defined beside the budget,
# whose form checks what a reservation costs (``Budget.clean``; ``agents.models`` cannot import this module), and
# named here too, where their callers import them from.

# How long a caller refused because runs in flight hold what is left of a budget is asked to wait: such a run
# ends (and gives back what it did not use) in seconds or minutes, not when the period ends. Where only runs parked
# awaiting approval hold it, until the first of their approvals expires (``_parked_runs_hold_until``), at most
# ``PLATFORM_APPROVAL_TTL_S``, and never less than this.
IN_FLIGHT_RETRY_AFTER_S = 5

# ``fields["reason"]`` of a ``429 budget_exceeded``: the period's spend reached a limit, or what it leaves is less
# than one run's reservation (both wait for the period's end), or it would leave room but the reservations of runs
# in flight take it.
REFUSED_USED_UP = "used_up"
REFUSED_LESS_THAN_A_RUN = "less_than_a_run"
REFUSED_RUNS_IN_FLIGHT = "runs_in_flight"

# What the counters (``BudgetUsage``, ``BudgetReservation``: 64-bit columns) hold.
COUNTER_MAX = 2**63 - 1

# --- configuration services (audited) ---------------------------------------------------------------------


def model_price_create(*, actor: Any, via: str, data: Mapping[str, Any]) -> ModelPrice:
    return audited_save(ModelPrice(), actor=actor, via=via, data=data)


def model_price_update(*, price: ModelPrice, actor: Any, via: str, data: Mapping[str, Any] | None = None) -> ModelPrice:
    return audited_save(price, actor=actor, via=via, data=data)


def model_price_delete(*, price: ModelPrice, actor: Any, via: str) -> None:
    audited_delete(price, actor=actor, via=via)


@transaction.atomic
def budget_create(*, actor: Any, via: str, data: Mapping[str, Any]) -> Budget:
    """Create the budget (audited). Switched on, it opens its period's counters with what its API key or agent
    spent in the period so far (``_usage_open``): a budget created mid-month limits the month, not what is left
    of it."""
    budget = audited_save(Budget(), actor=actor, via=via, data=data)
    if budget.enabled:
        _usage_open(budget)
    return budget


# What a budget belongs to: fixed once it exists (``budget_update``).
BUDGET_OWNER_FIELDS = ("api_key", "agent")


@transaction.atomic
def budget_update(*, budget: Budget, actor: Any, via: str, data: Mapping[str, Any] | None = None) -> Budget:
    """Change the budget (audited). A change of its period carries the reservations of its runs in flight to the
    new period's counters in the same transaction (``_reservations_carry``), and those counters count what the
    budget's API key or agent spent in that period so far, as does switching the budget on (``_usage_open``).

    A change of its owner (``api_key``, ``agent``) is refused (ValidationError at the field, nothing written): its
    counters and the reservations of its runs in flight are the owner's spend, and would go with it to the new
    owner (shown and limited by the old owner's spend, and charged the old owner's runs in flight). Another owner
    gets a new budget."""
    stored = Budget.objects.filter(pk=budget.pk).values(
        "period", "enabled", *(f"{name}_id" for name in BUDGET_OWNER_FIELDS)
    )
    before = stored.first()
    if before is not None:
        _owner_change_refuse(budget, before, data or {})
    period_before = before["period"] if before is not None else None
    enabled_before = before["enabled"] if before is not None else False
    budget = audited_save(budget, actor=actor, via=via, data=data)
    period_changed = budget.period != period_before
    if period_changed or (budget.enabled and not enabled_before):
        _usage_open(budget, carry=period_changed)
    return budget


def _owner_change_refuse(budget: Budget, before: Mapping[str, Any], data: Mapping[str, Any]) -> None:
    """Raise a ValidationError naming each owner field that ``budget`` (or ``data``) sets to another than the
    stored ``before``."""
    changed = []
    for name in BUDGET_OWNER_FIELDS:
        if name in data:
            asked = getattr(data[name], "pk", data[name])
        else:
            asked = data.get(f"{name}_id", getattr(budget, f"{name}_id"))
        if asked != before[f"{name}_id"]:
            changed.append(name)
    if changed:
        message = _(
            "A budget's API key or agent cannot be changed once it exists (its spend and runs in flight are "
            "theirs): create a new budget for the other owner."
        )
        raise ValidationError({name: ValidationError(message, code="owner_fixed") for name in changed})


def _reservations_carry(budget: Budget) -> None:
    """Move the budget's open reservations (its runs in flight) to the counters of its period now. Left on the old
    period's row, which no admission reads once the period changed, they held no room: new runs were admitted
    beside them past the limit, and they settled their spend there, outside the period now shown and limited.

    Called after the change's ``UPDATE`` of the budget's row, whose lock an admission takes before it reserves
    (``_budget_locked``): an admission either committed before (its reservation is moved here) or reads the new
    period. The moved reservations are locked first (a settlement takes its reservation, then its counters):
    one settled meanwhile is settled on the row it reserved on; one settled after this commits, on the new row
    (``budget_settle`` reads the row after its compare-and-swap)."""
    start, _end = period_bounds(budget.period, timezone.now())
    usage = _usage_row(budget, start)
    if usage is None:
        return
    carried = list(
        BudgetReservation.objects.select_for_update(of=("self",))
        .filter(usage__budget=budget, settled_at__isnull=True)
        .exclude(usage=usage)
        .order_by("pk")
    )
    if not carried:
        return
    left: dict[int, tuple[int, int]] = {}  # counter row -> (tokens, cost) its reservations took away
    for reservation in carried:
        tokens, cost = left.get(reservation.usage_id, (0, 0))
        left[reservation.usage_id] = (tokens + reservation.tokens, cost + reservation.cost_micros)
    BudgetReservation.objects.filter(pk__in=[reservation.pk for reservation in carried]).update(usage=usage)
    for usage_id, (tokens, cost) in sorted(left.items()):
        BudgetUsage.objects.filter(pk=usage_id).update(
            reserved_tokens=F("reserved_tokens") - tokens, reserved_cost_micros=F("reserved_cost_micros") - cost
        )
    BudgetUsage.objects.filter(pk=usage.pk).update(
        reserved_tokens=F("reserved_tokens") + sum(tokens for tokens, _cost in left.values()),
        reserved_cost_micros=F("reserved_cost_micros") + sum(cost for _tokens, cost in left.values()),
    )


def _usage_open(budget: Budget, *, carry: bool = False) -> None:
    """Count on the budget's counters for its period now what its API key or agent spent in that period (the runs
    ``GET /usage`` sums, ``period_runs``), in the transaction of the change that opens them (the budget's
    creation, a change of its period, switching it on); ``carry``: a change of its period, whose open reservations
    are carried to these counters first (``_reservations_carry``). Opened empty, they forgot that spend, and
    admitted runs past the limit (a key that spent 3,052 of a day's 5,000 tokens was admitted two more runs when
    the budget became a month one: 6,104 spent against 5,000).

    The counters are raised to that spend, never lowered: it is a total of the runs, not an addition, so a row
    the usual path opened (``budget_reserve``, at a period's start) and charged its runs on, or a period the budget
    changes back to, counts no run twice. Left out: the runs holding an open reservation of the budget (they add
    their spend to these counters when they settle, ``budget_settle``). Counted besides: the runs settled on these
    counters that were created before the period (a month's run in flight carried to a new day's counters).

    Switched on, the budget also reserves on these counters for each of its runs in flight that holds no
    reservation of it (admitted before it existed or was on, ``_in_flight_reserve``): such a run settled onto
    nothing, and runs were admitted beside it past the limit (two runs in flight when a day's 5,000 tokens budget
    was created, then two more admitted: 6,184 spent). Their rows are locked first, before any reservation or
    counter (as a run's end takes its row, then its reservations, then its counters): one ending meanwhile is
    counted as ended (``spent``), one ending after this commits settles its new reservation."""
    start, _end = period_bounds(budget.period, timezone.now())
    reservations = BudgetReservation.objects.filter(usage__budget=budget)
    runs = budget_runs(budget)
    in_flight = _runs_in_flight_locked(runs.exclude(pk__in=reservations.values("run_id"))) if budget.enabled else []
    if carry:
        _reservations_carry(budget)
    counted = period_runs(runs, start=start)
    usage = BudgetUsage.objects.filter(budget=budget, period_start=start).first()
    if usage is not None:
        counted |= runs.filter(pk__in=reservations.filter(usage=usage).values("run_id"))
    # The runs given a reservation here are left out too: they count their whole spend when they settle.
    spent = _totals(
        counted.exclude(pk__in=reservations.filter(settled_at__isnull=True).values("run_id")).exclude(
            pk__in=[run.pk for run in in_flight]
        )
    )
    if not (spent.tokens or spent.cost_micros or in_flight):
        return  # nothing to count: the counters are left as they are, or to the first admission to open
    usage = usage or _usage_row(budget, start)
    if usage is None:
        return
    BudgetUsage.objects.filter(pk=usage.pk).update(
        used_tokens=Greatest(F("used_tokens"), spent.tokens),
        used_cost_micros=Greatest(F("used_cost_micros"), spent.cost_micros),
    )
    if in_flight:
        _in_flight_reserve(budget, usage, in_flight)


def _runs_in_flight_locked(runs: QuerySet[Run]) -> list[Run]:
    """Those of ``runs`` that have not ended, their rows held until the transaction ends (a run's end waits, then
    finds the reservations given them), with what prices them (``run_model``)."""
    return list(
        runs.filter(status__in=RUN_IN_FLIGHT_STATUSES)
        .select_for_update(no_key=True, of=("self",))
        .select_related("agent", "version")
        .defer("agent__model_secrets")
        .order_by("pk")
    )


def _in_flight_reserve(budget: Budget, usage: BudgetUsage, runs: list[Run]) -> None:
    """Reserve on the counters for each of ``runs`` (in flight, holding no reservation of the budget) what
    ``budget_reserve`` would have, at its model's price, as if it had been admitted now; never refused (the run is
    already in flight): what they reserve may take the counters past the limit, which holds back new admissions
    until they settle."""
    prices: dict[tuple[str, str], ModelPrice | None] = {}
    created = []
    for run in runs:
        provider, model_id = run_model(run)
        if (provider, model_id) not in prices:
            prices[provider, model_id] = model_price_for(provider=provider, model_id=model_id)
        price = prices[provider, model_id]
        created.append(
            BudgetReservation(
                run=run,
                usage=usage,
                tokens=budget.run_reservation_tokens,
                cost_micros=_reservation_cost_micros(price=price, tokens=budget.run_reservation_tokens),
                provider=provider,
                model_id=model_id,
                **_admission_price_fields(price),
            )
        )
    BudgetReservation.objects.bulk_create(created)
    BudgetUsage.objects.filter(pk=usage.pk).update(
        reserved_tokens=F("reserved_tokens") + sum(reservation.tokens for reservation in created),
        reserved_cost_micros=F("reserved_cost_micros") + sum(reservation.cost_micros for reservation in created),
    )


@transaction.atomic
def budget_key_rotate(*, budget: Budget, api_key: ApiKey, actor: Any, via: str) -> Budget:
    """Move an API key's budget to the key that replaces it (``create_api_key --replace``: the same caller's key
    rotated), with its counters and the reservations of its runs in flight (audited as the budget's change): its
    spend so far keeps limiting the caller. Copied to the new key, the budget opened empty counters, and every
    rotation (``bin/up`` replaces its key at each start) gave the caller a fresh period. The one change of a
    budget's owner there is (``budget_update`` refuses it: another owner's spend is not this one's)."""
    return audited_save(budget, actor=actor, via=via, data={"api_key": api_key})


def budget_delete(*, budget: Budget, actor: Any, via: str) -> None:
    audited_delete(budget, actor=actor, via=via)


# --- prices and costs ---------------------------------------------------------------------------------------


def cost_micros(*, price: ModelPrice | None, token_usage: Mapping[str, Any]) -> int:
    """A run's cost in millionths of a dollar: input tokens (less the cached ones, priced apart), output tokens,
    cache reads and writes, each at its price per million tokens — so a token at $X per 1M costs X µUSD."""
    if price is None:
        return 0
    read = int(token_usage.get("cache_read_tokens") or 0)
    written = int(token_usage.get("cache_creation_tokens") or 0)
    fresh = max(int(token_usage.get("input_tokens") or 0) - read - written, 0)
    output = int(token_usage.get("output_tokens") or 0)
    total = (
        Decimal(fresh) * price.input_per_mtok
        + Decimal(output) * price.output_per_mtok
        + Decimal(read) * (price.cache_read_per_mtok if price.cache_read_per_mtok is not None else price.input_per_mtok)
        + Decimal(written)
        * (price.cache_write_per_mtok if price.cache_write_per_mtok is not None else price.input_per_mtok)
    )
    return math.ceil(total)


# --- periods ------------------------------------------------------------------------------------------------


def period_bounds(period: str, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) of the UTC day or month that holds ``now``."""
    now = now.astimezone(dt.UTC)
    if period == Budget.Period.MONTH:
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        days = calendar.monthrange(start.year, start.month)[1]
        return start, start + dt.timedelta(days=days)
    start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return start, start + dt.timedelta(days=1)


def _usage_row(budget: Budget, period_start: dt.datetime) -> BudgetUsage | None:
    """The budget's counters for the period, created where there are none yet; None where the budget is gone (an
    admin deleted it since the caller read it: it limits nothing now)."""
    row = BudgetUsage.objects.filter(budget=budget, period_start=period_start).first()
    if row is not None:
        return row
    # The budget's row held against its deletion until this transaction ends: the foreign key is checked only at
    # commit (deferred), so counters created for a budget deleted meanwhile failed the whole submission there, a 500.
    if not Budget.objects.select_for_update(no_key=True).filter(pk=budget.pk).exists():
        return None
    try:
        with transaction.atomic():
            return BudgetUsage.objects.create(budget=budget, period_start=period_start)
    except IntegrityError:  # created by a concurrent admission
        return BudgetUsage.objects.get(budget=budget, period_start=period_start)


# --- admission and settlement -------------------------------------------------------------------------------


def budgets_for(*, agent: Agent, api_key: ApiKey | None) -> list[Budget]:
    scope = Q(agent=agent) | (Q(api_key=api_key) if api_key is not None else Q(pk__in=[]))
    return list(Budget.objects.filter(scope, enabled=True).order_by("id"))


def budget_reserve(*, run: Run, agent: Agent, api_key: ApiKey | None, budgets: list[Budget] | None = None) -> None:
    """Reserve the run's share of every budget of its key and agent, or refuse it. Call inside the transaction
    that creates the run. ``budgets``: the key's and the agent's budgets where the caller has them
    (``agents.config_cache``); each is read again, locked (``_budget_locked``), before it is reserved on.

    Raises ApplicationError 429 ``budget_exceeded`` (``_budget_refusal``: ``fields["reason"]`` says whether the
    period's spend leaves no room, ``Retry-After`` until the period ends, or the runs in flight hold what is left,
    ``Retry-After`` a few seconds), or 409 ``budget_misconfigured`` where one run's reservation alone does not fit
    the budget (``_reservation_fit_check``)."""
    budgets = budgets_for(agent=agent, api_key=api_key) if budgets is None else budgets
    if not budgets:
        return
    now = timezone.now()
    provider, model_id = run_model(run)
    price = model_price_for(provider=provider, model_id=model_id)
    for listed in budgets:
        budget = _budget_locked(listed)
        if budget is None:
            continue
        tokens = budget.run_reservation_tokens
        cost = _reservation_cost_micros(price=price, tokens=tokens)
        owner = _("this API key") if budget.api_key_id else _("agent '%(slug)s'") % {"slug": agent.slug}
        _reservation_fit_check(
            budget,
            owner=owner,
            tokens=tokens,
            cost=cost,
            model=model_id or provider,
            priced=price is not None or provider in UNPAID_PROVIDERS,
        )
        start, end = period_bounds(budget.period, now)
        usage = _usage_row(budget, start)
        if usage is None:
            continue
        if not _reserved(budget, usage, tokens=tokens, cost=cost):
            raise _budget_refusal(budget, usage, owner=owner, tokens=tokens, cost=cost, now=now, end=end)
        BudgetReservation.objects.create(
            run=run,
            usage=usage,
            tokens=tokens,
            cost_micros=cost,
            provider=provider,
            model_id=model_id,
            **_admission_price_fields(price),
        )


def _budget_locked(budget: Budget) -> Budget | None:
    """The budget as stored now, its row held until the admission's transaction ends; None where it was deleted or
    disabled since the caller read it (it limits nothing now). Held, a change of its period waits for this
    admission to end (and carries its reservation to the new period's counters, ``_reservations_carry``), or this
    admission waits for the change and reads the new period: no run reserves on a period's counters the change
    has left behind. Held against its deletion too: the counters ``_usage_row`` creates for it are checked against
    it only at commit (a deferred foreign key)."""
    return Budget.objects.select_for_update(no_key=True).filter(pk=budget.pk, enabled=True).first()


def _cost_limit_micros(budget: Budget) -> int | None:
    return int(budget.max_cost * MICROS_PER_USD) if budget.max_cost is not None else None


def _reservation_fit_check(budget: Budget, *, owner: str, tokens: int, cost: int, model: str, priced: bool) -> None:
    """Raises ApplicationError 409 ``budget_misconfigured`` where no run can be admitted until an admin changes the
    budget: its reservation cannot be counted (stored before the field's bound), or alone exceeds a limit (its
    cost at the run's model's price, which an API key's budget does not know when it is saved; a price raised
    since an agent's budget was saved), or the budget limits cost and the run's model has no price (``priced``
    False: its runs would cost nothing, and the limit would never hold one back). Told as such, not as a budget
    used up that resets at the period's end."""
    refusal = None
    if tokens > INT32_MAX or cost > COUNTER_MAX:
        # Its cost would not fit the counters (a database error on every submission).
        refusal = _(
            "The %(period)s budget of %(owner)s reserves more tokens per run than can be counted; an admin must "
            "lower its tokens reserved per run to at most %(max)s."
        ) % {"period": budget.get_period_display(), "owner": owner, "max": f"{INT32_MAX:,}"}
    elif budget.max_tokens is not None and tokens > budget.max_tokens:
        refusal = _(
            "A run reserves %(tokens)s tokens, more than the %(period)s budget of %(owner)s allows (%(limit)s "
            "tokens): no run is admitted until an admin raises its token limit or lowers its tokens reserved per run."
        ) % {
            "tokens": f"{tokens:,}",
            "period": budget.get_period_display(),
            "owner": owner,
            "limit": f"{budget.max_tokens:,}",
        }
    elif budget.max_cost is not None and not priced:
        refusal = _(
            "The %(period)s budget of %(owner)s limits cost, but model %(model)s has no price: its runs would cost "
            "nothing against the limit. No such run is admitted until an admin sets the model's price."
        ) % {"period": budget.get_period_display(), "owner": owner, "model": model}
    elif (limit := _cost_limit_micros(budget)) is not None and cost > limit:
        refusal = _(
            "A run reserves %(tokens)s tokens, which cost up to US$%(cost)s at the price of model %(model)s, more "
            "than the %(period)s budget of %(owner)s allows (US$%(limit)s): no such run is admitted until an admin "
            "raises its cost limit or lowers its tokens reserved per run."
        ) % {
            "tokens": f"{tokens:,}",
            "cost": usd_text(cost),
            "model": model,
            "period": budget.get_period_display(),
            "owner": owner,
            "limit": usd_text(limit),
        }
    if refusal is not None:
        raise ApplicationError(refusal, code="budget_misconfigured", status=409, fields={"budget": budget.pk})


def _reserved(budget: Budget, usage: BudgetUsage, *, tokens: int, cost: int) -> bool:
    """Add the reservation to the period's counters if it fits beside what was used and what the runs in flight
    reserved; whether it did. One conditional ``UPDATE``: the database checks the condition on the row it updates
    (PostgreSQL again after taking the row's lock), so concurrent admissions never reserve past the limit."""
    fits = BudgetUsage.objects.filter(pk=usage.pk)
    if budget.max_tokens is not None:
        fits = fits.filter(used_tokens__lte=budget.max_tokens - tokens - F("reserved_tokens"))
    if (limit := _cost_limit_micros(budget)) is not None:
        fits = fits.filter(used_cost_micros__lte=limit - cost - F("reserved_cost_micros"))
    added = fits.update(
        reserved_tokens=F("reserved_tokens") + tokens, reserved_cost_micros=F("reserved_cost_micros") + cost
    )
    return added == 1


def _budget_refusal(
    budget: Budget, usage: BudgetUsage, *, owner: str, tokens: int, cost: int, now: dt.datetime, end: dt.datetime
) -> ApplicationError:
    """The 429 ``budget_exceeded`` of a reservation that did not fit. Where what was used leaves room for it, the
    runs in flight hold that room and give back what they do not use within seconds or minutes: the caller is told
    so and to try again shortly (``runs_in_flight``), not to wait for the period's end (``used_up`` where the spend
    reached a limit, ``less_than_a_run`` where what it leaves is less than one run's reservation); runs parked
    awaiting approval hold it until decided, and where only such runs hold it the caller is told so, and to try
    again when the first of their approvals expires (still ``runs_in_flight``)."""
    used_tokens, used_cost = (
        BudgetUsage.objects.filter(pk=usage.pk).values_list("used_tokens", "used_cost_micros").get()
    )
    limit = _cost_limit_micros(budget)
    tokens_left = budget.max_tokens - used_tokens if budget.max_tokens is not None else None
    cost_left = limit - used_cost if limit is not None else None
    period = budget.get_period_display()
    until_end = max(1, math.ceil((end - now).total_seconds()))
    # Told in the reader's time zone, named (the period's bounds are UTC ones): ``fields`` keep the ISO value.
    resets = date_format(timezone.localtime(end), "Y-m-d H:i T")
    if (tokens_left is not None and tokens_left <= 0) or (cost_left is not None and cost_left <= 0):
        message = _("The %(period)s budget of %(owner)s is used up; it resets at %(end)s.") % {
            "period": period,
            "owner": owner,
            "end": resets,
        }
        retry_after, reason = until_end, REFUSED_USED_UP
    elif tokens_left is not None and tokens_left < tokens:
        # Not used up (``GET /usage`` shows what is left): too little is left for one run's reservation.
        message = _(
            "The %(period)s budget of %(owner)s has %(left)s tokens left, less than one run's reservation of "
            "%(reserved)s tokens; it resets at %(end)s."
        ) % {"period": period, "owner": owner, "left": f"{tokens_left:,}", "reserved": f"{tokens:,}", "end": resets}
        retry_after, reason = until_end, REFUSED_LESS_THAN_A_RUN
    elif cost_left is not None and cost_left < cost:
        message = _(
            "The %(period)s budget of %(owner)s has US$%(left)s left, less than one run's reservation of "
            "US$%(reserved)s; it resets at %(end)s."
        ) % {"period": period, "owner": owner, "left": usd_text(cost_left), "reserved": usd_text(cost), "end": resets}
        retry_after, reason = until_end, REFUSED_LESS_THAN_A_RUN
    elif (parked_until := _parked_runs_hold_until(usage)) is not None:
        message = _(
            "The room left in the %(period)s budget of %(owner)s is held by runs awaiting approval; try again when "
            "one of them has been decided or its approval has expired."
        ) % {"period": period, "owner": owner}
        wait = math.ceil((parked_until - now).total_seconds())
        retry_after = min(max(IN_FLIGHT_RETRY_AFTER_S, wait), settings.PLATFORM_APPROVAL_TTL_S, until_end)
        reason = REFUSED_RUNS_IN_FLIGHT
    else:
        message = _(
            "The room left in the %(period)s budget of %(owner)s is held by runs in flight; try again when one of "
            "them has ended."
        ) % {"period": period, "owner": owner}
        retry_after, reason = IN_FLIGHT_RETRY_AFTER_S, REFUSED_RUNS_IN_FLIGHT
    return ApplicationError(
        message,
        code="budget_exceeded",
        status=429,
        headers={"Retry-After": str(retry_after)},
        fields={"budget": budget.pk, "resets_at": end.isoformat(), "reason": reason},
    )


def _parked_runs_hold_until(usage: BudgetUsage) -> dt.datetime | None:
    """When the first approval expires that the runs holding the counters' room wait for, where every one of them
    is parked awaiting approval (such a run holds its reservation until a person decides, or its approval expires
    after ``PLATFORM_APPROVAL_TTL_S``: not seconds); None where one of them runs (it ends within seconds or minutes)
    or none waits for an approval."""
    holders = BudgetReservation.objects.filter(usage=usage, settled_at__isnull=True).values("run_id")
    if Run.objects.filter(pk__in=holders).exclude(status=Run.Status.AWAITING_APPROVAL).exists():
        return None
    pending = Approval.objects.filter(run_id__in=holders, status=Approval.Status.PENDING)
    earliest: dt.datetime | None = pending.aggregate(at=Min("expires_at"))["at"]
    return earliest


def budget_refused_for_runs_in_flight(exc: ApplicationError) -> bool:
    """Whether a submission was refused only because runs in flight hold a budget's room: it may be admitted once
    they end (an eval's case waits for that, ``evals.services``)."""
    return exc.code == "budget_exceeded" and exc.fields.get("reason") == REFUSED_RUNS_IN_FLIGHT


def _admission_price_fields(price: ModelPrice | None) -> dict[str, Decimal | None]:
    """The reservation's copy of the price it was taken at (``run_price``); a model without a price is free."""
    if price is None:
        return {"input_per_mtok": Decimal(0), "output_per_mtok": Decimal(0)}
    return {
        "input_per_mtok": price.input_per_mtok,
        "output_per_mtok": price.output_per_mtok,
        "cache_read_per_mtok": price.cache_read_per_mtok,
        "cache_write_per_mtok": price.cache_write_per_mtok,
    }


def token_ceiling_sql(run_id: str) -> str:
    """The run's token ceiling — the fewest tokens one of its open reservations allows (the engine stops the run
    there), NULL without one — as SQL for the run whose id is the SQL ``run_id``: a run's claim reads it as a
    scalar subquery with the run's row (``agents.execution``, ``run_id`` its id column)."""
    table = connection.ops.quote_name(BudgetReservation._meta.db_table)
    return f"SELECT MIN(tokens) FROM {table} WHERE run_id = {run_id} AND settled_at IS NULL"  # noqa: S608 - the model's table; run_id is SQL of ours


def run_spent_usage(*, run_id: Any) -> dict[str, int]:
    """The tokens every model call of the run used, from its ``model_turn`` events (each carries its turn's
    ``usage``): every pass and every delivery, including those of a worker that was lost or stopped before it
    stored an outcome. Turns whose events carry no usage count nothing."""
    totals: dict[str, int] = {}
    for data in RunEvent.objects.filter(run_id=run_id, kind="model_turn").values_list("data", flat=True):
        usage = data.get("usage") if isinstance(data, dict) else None
        if not isinstance(usage, dict):
            continue
        for key, value in usage.items():
            if isinstance(value, int) and not isinstance(value, bool):
                totals[key] = totals.get(key, 0) + value
    return totals


@transaction.atomic
def budget_settle(*, run_id: Any) -> int:
    """Release the run's reservations and count its tokens and cost, once: each reservation is settled by
    compare-and-swap, so a second call (a retried task, a cancel racing the worker) settles nothing again.

    What counts is the larger of what the run stored (its worker's outcome) and what its model calls used by
    their events (``run_spent_usage``): a run that ends without its worker storing a result (cancelled while
    running, failed by its time limit or by the reconciler when its worker was lost) is charged for the calls it
    made. The run's ``tokens``/``cost_micros`` are raised to what was counted, so that the usage views agree with
    the budgets; a later call that finds more spent (the model call that was under way when the run was
    cancelled, whose event its worker wrote afterwards) adds the difference to the budgets it already settled.
    Returns how many reservations this call settled."""
    # The agent's model secrets are not read: one this worker cannot decrypt must not keep the run's reservation.
    run = Run.objects.filter(pk=run_id).select_related("agent", "version").defer("agent__model_secrets").first()
    if run is None:
        return 0
    spent = run_spent_usage(run_id=run_id)
    tokens, cost = run.tokens, run.cost_micros
    extra_tokens, extra_cost = 0, 0
    if int(spent.get("input_tokens", 0)) + int(spent.get("output_tokens", 0)) > run.tokens:  # else: as stored
        spent_fields = run_usage_fields(run=run, token_usage=spent)
        tokens = max(run.tokens, spent_fields["tokens"])
        cost = max(run.cost_micros, spent_fields["cost_micros"])
        raised = Run.objects.filter(pk=run_id, tokens=run.tokens, cost_micros=run.cost_micros).update(
            tokens=tokens, cost_micros=cost, token_usage=_token_usage_raised(run.token_usage, spent)
        )
        if raised != 1:  # another settlement raised it first and counted the difference: count what it stored
            tokens, cost = Run.objects.filter(pk=run_id).values_list("tokens", "cost_micros").get()
        else:
            extra_tokens, extra_cost = tokens - run.tokens, cost - run.cost_micros
    now = timezone.now()
    settled = 0
    # Their counters locked in the order an admission locks them (``budget_reserve``: by budget): in the table's
    # order (which a period's change rewrites, ``_reservations_carry``) a settlement and an admission of the same
    # budgets could each hold the row the other waits for, and one of them failed (a deadlock).
    for reservation in BudgetReservation.objects.filter(run_id=run_id).order_by("usage__budget_id", "pk"):
        if reservation.settled_at is not None:
            if extra_tokens or extra_cost:  # settled before: only what was spent since
                BudgetUsage.objects.filter(pk=reservation.usage_id).update(
                    used_tokens=F("used_tokens") + extra_tokens, used_cost_micros=F("used_cost_micros") + extra_cost
                )
            continue
        if BudgetReservation.objects.filter(pk=reservation.pk, settled_at__isnull=True).update(settled_at=now) != 1:
            continue
        # Its counters as they are now that it is held: a change of the budget's period may have carried it to the
        # new period's row since it was read (``_reservations_carry``).
        usage_id = BudgetReservation.objects.filter(pk=reservation.pk).values_list("usage_id", flat=True).get()
        BudgetUsage.objects.filter(pk=usage_id).update(
            reserved_tokens=F("reserved_tokens") - reservation.tokens,
            reserved_cost_micros=F("reserved_cost_micros") - reservation.cost_micros,
            used_tokens=F("used_tokens") + tokens,
            used_cost_micros=F("used_cost_micros") + cost,
        )
        settled += 1
    return settled


def _token_usage_raised(stored: Mapping[str, Any] | None, spent: Mapping[str, int]) -> dict[str, Any]:
    """The run's ``token_usage`` with each count its model calls' events add up to more (``run_spent_usage``:
    input, output, total, model calls, cache reads and writes) raised to theirs: what the run stored (its worker's
    outcome, or the first settlement's count) misses a call made after it (the call under way when the run was
    cancelled), and its token usage must show what its tokens and cost count."""
    raised = dict(stored or {})
    for key, value in spent.items():
        if key not in raised or value > int(raised[key] or 0):
            raised[key] = value
    return raised


def run_model(run: Run) -> tuple[str, str]:
    """The provider and model a run calls: its version's (frozen when published; an A/B arm's, a shadow's), else
    its agent's as stored. A run is priced by it, not by the agent's draft."""
    return version_model(run.version if run.version_id is not None else None, run.agent)


def run_price(run: Run, *, token_usage: Mapping[str, Any]) -> ModelPrice | None:
    """The price a run is charged at for this token usage. None: free.

    - A run a budget admitted, whose model is the one it was admitted for: the price of that model when it was
      admitted (kept on its reservation, whose cost was reserved at it): a price raised or first set while the run
      is in flight cannot take the budget past its limit.
    - A run a budget admitted whose model changed since (a run of an agent never published runs the model its
      agent names when the run is claimed, and an admin may switch it while the run is queued or parked): the
      dearer, for this usage, of the admission price and the price now of the model it ran. The admission price
      alone counted a dear model's tokens at a cheap model's rates, so the limit was not a limit on what was
      spent; the dearer of the two charges at least what was spent, and never less than the run would have cost
      had its model stayed. Its reservation was priced for the old model, so such a run may take its period's
      spend past the limit by its own overrun; the counters show that spend, and no run is admitted while it
      stands.
    - Any other run (no budget, or a reservation kept before its price was): its model's price now, as it
      finishes (no limit rests on it, and a submission without a budget reads no price)."""
    provider, model_id = run_model(run)
    reservation = BudgetReservation.objects.filter(run_id=run.pk, input_per_mtok__isnull=False).order_by("pk").first()
    admitted = reservation.admission_price() if reservation is not None else None
    if reservation is not None and (reservation.provider, reservation.model_id) == (provider, model_id):
        return admitted
    current = model_price_for(provider=provider, model_id=model_id)
    if admitted is None or cost_micros(price=admitted, token_usage=token_usage) <= cost_micros(
        price=current, token_usage=token_usage
    ):
        return current
    return admitted


def run_usage_fields(*, run: Run, token_usage: Mapping[str, Any]) -> dict[str, int]:
    """The run's ``tokens`` and ``cost_micros`` columns for this token usage at the run's price (``run_price``:
    its model's, ``run_model``; no price is read for a run that used no token: it costs nothing at any price)."""
    tokens = int(token_usage.get("input_tokens") or 0) + int(token_usage.get("output_tokens") or 0)
    if not any(int(token_usage.get(name) or 0) for name in _PRICED_COUNTS):
        return {"tokens": tokens, "cost_micros": 0}
    price = run_price(run, token_usage=token_usage)
    return {"tokens": tokens, "cost_micros": cost_micros(price=price, token_usage=token_usage)}


# What ``cost_micros`` charges for.
_PRICED_COUNTS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens")


# --- reading usage ------------------------------------------------------------------------------------------


def usd(micros: int | None) -> float:
    return round((micros or 0) / MICROS_PER_USD, 6)


@dataclass(frozen=True)
class UsageTotals:
    runs: int
    tokens: int
    cost_micros: int

    def as_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "tokens": self.tokens, "cost_usd": usd(self.cost_micros)}


def key_runs(api_key: ApiKey | int) -> QuerySet[Run]:
    """The runs an API key's spend is (``api_key``: the key or its id): every run it submitted."""
    return Run.objects.filter(api_key=api_key)


def budget_runs(budget: Budget) -> QuerySet[Run]:
    """The runs a budget limits (``budgets_for``): its API key's (``key_runs``, as ``GET /usage`` sums them), or
    every run of its agent (callers', evaluations', shadows')."""
    if budget.api_key_id is not None:
        return key_runs(budget.api_key_id)
    assert budget.agent_id is not None  # one or the other (``Budget.clean``)
    return Run.objects.filter(agent_id=budget.agent_id)


def period_runs(runs: QuerySet[Run], *, start: dt.datetime) -> QuerySet[Run]:
    """Those of ``runs`` that count in the period that began at ``start`` (``period_bounds``: a UTC day's or
    month's): the runs created since. ``GET /usage``'s ``today`` and ``this_month`` and a budget's counters when
    they are opened (``_usage_open``) count these."""
    return runs.filter(created_at__gte=start)


def _totals(runs: Any) -> UsageTotals:
    agg = runs.aggregate(n=Count("id"), tokens=Sum("tokens"), cost=Sum("cost_micros"))
    return UsageTotals(runs=runs.count(), tokens=int(agg["tokens"] or 0), cost_micros=int(agg["cost"] or 0))


def usage_by_day(runs: Any, *, days: int, now: dt.datetime) -> list[dict[str, Any]]:
    """Tokens, cost and runs per UTC day over the last ``days`` days (days without runs included, as zeros)."""
    since = (now - dt.timedelta(days=days - 1)).astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    rows = (
        runs.filter(created_at__gte=since)
        .annotate(day=TruncDate("created_at", tzinfo=dt.UTC))
        .values("day")
        .annotate(tokens=Sum("tokens"), cost=Sum("cost_micros"), n=Count("id"))
        .order_by("day")
    )
    found = {r["day"]: r for r in rows}
    out = []
    for i in range(days):
        day = (since + dt.timedelta(days=i)).date()
        r = found.get(day, {})
        out.append(
            {
                "day": day.isoformat(),
                "runs": int(r.get("n") or 0),
                "tokens": int(r.get("tokens") or 0),
                "cost_usd": usd(r.get("cost")),
            }
        )
    return out


def budgets_with_current_usage(budgets: QuerySet[Budget], *, now: dt.datetime) -> QuerySet[Budget]:
    """``budgets`` with their counter rows of the day and the month that hold ``now`` read alongside, in one
    query for all of them (``current_usage``, for ``budget_state``'s ``usages``), and, for each one switched
    off, its period's spend summed from its runs in the budgets' own query (``runs_tokens``,
    ``runs_cost_micros``, for ``budget_runs_spend``; None on a budget switched on): a list of budgets reads no
    row per budget."""
    day_start, month_start = (period_bounds(period, now)[0] for period in (Budget.Period.DAY, Budget.Period.MONTH))
    current = BudgetUsage.objects.filter(period_start__in=[day_start, month_start])
    budgets = budgets.annotate(
        runs_period_start=Case(When(period=Budget.Period.MONTH, then=Value(month_start)), default=Value(day_start))
    )

    def runs_total(column: str) -> Case:
        def of(owner: str) -> Coalesce:
            # ``period_runs(budget_runs(budget))`` of each row: its key's runs, or every run of its agent.
            runs = Run.objects.filter(**{owner: OuterRef(owner)}, created_at__gte=OuterRef("runs_period_start"))
            total = runs.order_by().values(owner).annotate(total=Sum(column)).values("total")
            return Coalesce(Subquery(total), 0, output_field=BigIntegerField())

        return Case(
            When(enabled=True, then=Value(None)),
            When(api_key__isnull=False, then=of("api_key")),
            default=of("agent"),
            output_field=BigIntegerField(),
        )

    return budgets.annotate(
        runs_tokens=runs_total("tokens"), runs_cost_micros=runs_total("cost_micros")
    ).prefetch_related(Prefetch("usage", queryset=current, to_attr="current_usage"))


def budget_runs_spend(budget: Budget, *, now: dt.datetime) -> tuple[int, int]:
    """The tokens and cost (micros) its API key or agent spent in the budget's period that holds ``now``, summed
    from their runs (``period_runs`` of ``budget_runs``: what ``GET /usage`` sums, and what ``_usage_open`` counts
    when the budget is switched back on). The spend of a budget switched off: no admission reserves on it
    (``budgets_for``), so its counters stopped when it was switched off. Read with the page where
    ``budgets_with_current_usage`` read it."""
    tokens, cost = getattr(budget, "runs_tokens", None), getattr(budget, "runs_cost_micros", None)
    if tokens is not None and cost is not None:
        return int(tokens), int(cost)
    start, _end = period_bounds(budget.period, now)
    spent = _totals(period_runs(budget_runs(budget), start=start))
    return spent.tokens, spent.cost_micros


def budget_state(budget: Budget, *, now: dt.datetime, usages: Iterable[BudgetUsage] | None = None) -> dict[str, Any]:
    """The budget's limits and its use in the period that holds ``now``. ``usages``: its counter rows already
    read (``budgets_with_current_usage``), of which the period's is taken (none: nothing used yet); read here
    when not given."""
    start, end = period_bounds(budget.period, now)
    if usages is None:
        usage = BudgetUsage.objects.filter(budget=budget, period_start=start).first()
    else:
        usage = next((row for row in usages if row.period_start == start), None)
    return {
        "id": budget.pk,
        "scope": "api_key" if budget.api_key_id else "agent",
        "agent": budget.agent.slug if budget.agent is not None else None,
        "period": budget.period,
        "period_start": start.isoformat(),
        "resets_at": end.isoformat(),
        "max_tokens": budget.max_tokens,
        "max_cost_usd": float(budget.max_cost) if budget.max_cost is not None else None,
        "used_tokens": usage.used_tokens if usage else 0,
        "used_cost_usd": usd(usage.used_cost_micros if usage else 0),
        "reserved_tokens": usage.reserved_tokens if usage else 0,
        "reserved_cost_usd": usd(usage.reserved_cost_micros if usage else 0),
        "run_reservation_tokens": budget.run_reservation_tokens,
    }


def api_key_usage(*, api_key: ApiKey, days: int = 30) -> dict[str, Any]:
    """What ``GET /api/v1/usage`` shows a key: today's and this month's totals (``period_starts``: where each
    began, midnight UTC), per agent and per day, and the budgets that apply to it (its own, and those of the agents
    it may use)."""
    now = timezone.now()
    runs = key_runs(api_key)
    day_start, _day_end = period_bounds(Budget.Period.DAY, now)
    month_start, _month_end = period_bounds(Budget.Period.MONTH, now)
    month_runs = period_runs(runs, start=month_start)
    by_agent = (
        month_runs.values("agent__slug")
        .annotate(tokens=Sum("tokens"), cost=Sum("cost_micros"), n=Count("id"))
        .order_by("agent__slug")
    )
    agents = api_key.agents.all() if api_key.agents.exists() else Agent.objects.all()
    budgets = Budget.objects.filter(Q(api_key=api_key) | Q(agent__in=agents), enabled=True).select_related("agent")
    return {
        "api_key": api_key.prefix,
        # Days and months here (``today``, ``this_month``, ``by_day``, the budgets' periods) are UTC ones, said so in
        # the answer (the run times elsewhere in the API are in the server's time zone); beside the totals, whose
        # members callers compare whole.
        "day_boundary": "UTC",
        "period_starts": {"today": day_start.isoformat(), "this_month": month_start.isoformat()},
        "today": _totals(period_runs(runs, start=day_start)).as_dict(),
        "this_month": _totals(month_runs).as_dict(),
        "by_agent": [
            {
                "agent": r["agent__slug"],
                "runs": int(r["n"] or 0),
                "tokens": int(r["tokens"] or 0),
                "cost_usd": usd(r["cost"]),
            }
            for r in by_agent
        ],
        "by_day": usage_by_day(runs, days=days, now=now),
        "budgets": [budget_state(b, now=now) for b in budgets],
    }
