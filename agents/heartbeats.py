"""Workers' heartbeats: each worker writes one row every ``PLATFORM_WORKER_HEARTBEAT_S`` (its timer thread,
``agent_platform.celery``) while its consumer is connected to the broker, and removes it while not; the row names
the queues the worker consumes and its broker (``broker_identity``). ``/readyz`` asks whether a worker able to take
live runs (``workers_seen``: it consumes their queue on the web's own broker) wrote one within
``PLATFORM_READY_WORKER_MAX_AGE_S``. A worker that stops cleanly removes its own row; the row of one that was killed
ages out, and rows of workers gone for a day are removed by the next heartbeat of any worker."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from celery import current_app
from django.utils import timezone

from agents.dispatch import run_queue
from agents.models import Run, WorkerHeartbeat

FORGET_AFTER = timedelta(days=1)
# Between the queue names of a row's ``queues``.
QUEUE_SEPARATOR = ","
# The port a broker URL without one connects to, by scheme (so that ``redis://h`` and ``redis://h:6379`` are one).
_DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "amqp": 5672, "pyamqp": 5672, "amqps": 5671, "sentinel": 26379}


def broker_identity(url: str, transport_options: Mapping[str, Any] | None = None) -> str:
    """Which broker ``url`` names, as ``scheme://host:port/db`` (each URL of a ``;``-separated failover list): never
    its user or password. Redis' database defaults to 0. The embedded broker (``filesystem://``) is named by its
    folder (``data_folder_in``), which tells two installs on one machine apart."""
    identities = []
    for one in str(url or "").split(";"):
        one = one.strip()
        if not one:
            continue
        try:
            parts = urlsplit(one)
        except ValueError:  # unusable (an unclosed IPv6 bracket): the worker cannot connect with it either
            continue
        port: int | None = None
        with contextlib.suppress(ValueError):  # a malformed port: named without it
            port = parts.port
        scheme = parts.scheme.lower()
        if scheme == "filesystem":
            folder = str((transport_options or {}).get("data_folder_in") or "")
            with contextlib.suppress(OSError):
                folder = str(Path(folder).resolve()) if folder else ""
            identities.append(f"filesystem://{folder}")
            continue
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = port or _DEFAULT_PORTS.get(scheme.split("+", 1)[0])
        path = parts.path.strip("/")
        if scheme.split("+", 1)[0] in {"redis", "rediss"} and not path:
            path = "0"
        identities.append(f"{scheme}://{host}{f':{port}' if port else ''}/{path}")
    return ";".join(identities)[:500]


# A host name's addresses, read again after this many seconds (``same_broker``).
_ADDRESSES_TTL_S = 60.0
_addresses_read: dict[str, tuple[float, frozenset[str]]] = {}


def _addresses(host: str) -> frozenset[str]:
    """The addresses ``host`` resolves to (itself where it does not resolve), kept for ``_ADDRESSES_TTL_S``."""
    bare = host.strip("[]")
    read = _addresses_read.get(bare)
    if read is not None and time.monotonic() - read[0] < _ADDRESSES_TTL_S:
        return read[1]
    try:
        found = frozenset(str(info[4][0]) for info in socket.getaddrinfo(bare, None, type=socket.SOCK_STREAM))
    except (OSError, UnicodeError):
        found = frozenset()
    addresses = found or frozenset({bare})
    if len(_addresses_read) > 256:
        _addresses_read.clear()
    _addresses_read[bare] = (time.monotonic(), addresses)
    return addresses


def _endpoints(identity: str) -> list[tuple[str, str, str]]:
    """A ``broker_identity``'s brokers as (scheme, host, ``:port/db``)."""
    found = []
    for one in identity.split(";"):
        scheme, _sep, rest = one.partition("://")
        host, slash, path = rest.partition("/")
        name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
        if not colon or not port.isdigit():
            name, port = host, ""
        found.append((scheme, name, f":{port}/{path}" if slash else f":{port}"))
    return found


def same_broker(one: str, other: str) -> bool:
    """Whether two ``broker_identity`` strings name one broker: the same text, or (a web and a worker that spell its
    host differently: ``localhost`` and ``127.0.0.1``, a DNS name and its address) a broker of each with the same
    scheme, port and database whose host names share an address. The embedded broker's folder compares as text."""
    if one == other:
        return True
    for scheme, host, rest in _endpoints(one):
        for other_scheme, other_host, other_rest in _endpoints(other):
            if (scheme, rest) != (other_scheme, other_rest) or scheme == "filesystem":
                continue
            if host == other_host or _addresses(host) & _addresses(other_host):
                return True
    return False


def this_broker() -> str:
    """The identity (``broker_identity``) of the broker this process's Celery app uses."""
    return broker_identity(current_app.conf.broker_url, current_app.conf.broker_transport_options)


def live_run_queue() -> str:
    """The Celery queue live runs are sent to (``agents.dispatch.run_queue``: the default one)."""
    return run_queue(Run.Purpose.LIVE) or str(current_app.conf.task_default_queue)


def worker_heartbeat_record(
    *, worker: str, queues: Iterable[str] = (), broker: str = "", now: datetime | None = None
) -> None:
    """Note that ``worker`` (``host:pid``) is alive now, consuming ``queues`` on ``broker`` (``broker_identity``)."""
    now = now or timezone.now()
    WorkerHeartbeat.objects.update_or_create(
        worker=worker[:200],
        defaults={"seen_at": now, "queues": QUEUE_SEPARATOR.join(sorted(set(queues)))[:1000], "broker": broker[:500]},
    )
    WorkerHeartbeat.objects.filter(seen_at__lt=now - FORGET_AFTER).delete()


def worker_last_seen() -> datetime | None:
    """When any worker last said it was alive, or None if none ever did."""
    return WorkerHeartbeat.objects.order_by("-seen_at").values_list("seen_at", flat=True).first()


@dataclass(frozen=True)
class WorkersSeen:
    """The workers with a recent heartbeat: how many, how many of them consume the queue, how many are on the broker,
    and how many both (those able to take its runs)."""

    recent: int
    on_queue: int
    on_broker: int
    able: int


def workers_seen(*, since: datetime, queue: str, broker: str) -> WorkersSeen:
    """The workers whose heartbeat is no older than ``since``, against ``queue`` and ``broker`` (``broker_identity``).

    A row with blank queues or broker (written before the heartbeat named them) counts as consuming every queue on
    every broker, as every row counted before: otherwise upgrading would make every install unready until each of its
    workers restarted and wrote both."""
    recent = on_queue = on_broker = able = 0
    for queues, its_broker in WorkerHeartbeat.objects.filter(seen_at__gte=since).values_list("queues", "broker"):
        consumes = not queues or queue in queues.split(QUEUE_SEPARATOR)
        here = not its_broker or same_broker(its_broker, broker)
        recent += 1
        on_queue += int(consumes)
        on_broker += int(here)
        able += int(consumes and here)
    return WorkersSeen(recent=recent, on_queue=on_queue, on_broker=on_broker, able=able)


def worker_heartbeat_forget(*, worker: str) -> None:
    """Remove ``worker``'s (``host:pid``) row as it stops: otherwise ``/readyz`` and ``platform_workers_alive`` count
    it alive for up to ``PLATFORM_READY_WORKER_MAX_AGE_S`` after (the only worker stopped: ready all the same; a
    restarted one: counted twice)."""
    WorkerHeartbeat.objects.filter(worker=worker[:200]).delete()
