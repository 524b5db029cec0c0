"""The embedded broker: kombu's ``filesystem://`` transport, made safe to poll often.

The embedded default (one machine, nothing installed) passes runs to its workers as files in ``var/broker/queue``;
an idle worker looks for a new file every ``PLATFORM_BROKER_POLL_S`` (10 ms; kombu's default is a second, which
was a second's wait per run). Polling that often exposed two races of kombu's own transport, which this one
closes:

- kombu writes a message straight under its final name, so a worker polling at the wrong moment took a file
  still being written, failed to decode it and lost the message (the run then waited for the reconciler). Here a
  message is written under a temporary name and renamed into place: a worker sees all of it or nothing.
- kombu moves a taken message to the system's temporary folder, on another filesystem where it is one, where
  ``shutil.move`` copies: two workers could both copy the same message. Here it is renamed within the broker's
  folder, which succeeds for one worker only.

A worker asked to stop (SIGTERM, Ctrl-C: Celery's warm shutdown) stops waiting at once: Celery's worker loop
drains the broker for two seconds at a time and looks at its stop flag only between drains (and then drains once
more), and kombu's polling drain waits out the whole two seconds where nothing comes, so an idle worker spent up to
four seconds there. Here the drain gives up as soon as the flag is set, before it takes another message: none is
taken that the stopping worker would then have to run, and a message not taken stays queued for the next worker.

Idle cost: each poll lists the queue folder (a few entries) once per queue a worker consumes; measured by
``bench.latency`` (``embedded_idle_worker_cpu_pct``). Selected by ``CELERY_BROKER_TRANSPORT`` where the broker
URL is ``filesystem://`` (``agent_platform.settings``).
"""

from __future__ import annotations

import os
import uuid
from queue import Empty
from time import monotonic, sleep
from typing import Any

from celery.worker import state as worker_state
from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

TEMPORARY_SUFFIX = ".part"


class Channel(filesystem.Channel):
    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Write the message under a name no consumer takes, then rename it into place (atomic)."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + TEMPORARY_SUFFIX
        try:
            with open(partial, "wb") as target:
                target.write(str_to_bytes(dumps(message)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        """Take the oldest message of ``queue``: renamed into the processed folder (only one consumer's rename
        of a file succeeds), read, and removed unless ``store_processed``."""
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            taken = os.path.join(self.processed_folder, name)
            try:
                os.rename(os.path.join(self.data_folder_in, name), taken)
            except OSError:  # another consumer took it
                continue
            try:
                with open(taken, "rb") as source:
                    payload = source.read()
                if not self.store_processed:
                    os.remove(taken)
            except OSError as exc:
                raise ChannelError(f"Cannot read file {taken!r} from queue.") from exc
            return loads(bytes_to_str(payload))
        raise Empty()


def worker_is_stopping() -> bool:
    """Whether this process is a Celery worker that was asked to stop (the flags ``celery.worker.state.
    maybe_shutdown`` raises on; the warm shutdown's is 0, so not a truth test)."""
    flags: tuple[object, object] = (worker_state.should_stop, worker_state.should_terminate)
    return any(flag is not None and flag is not False for flag in flags)


class Transport(filesystem.Transport):
    Channel = Channel

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:  # type: ignore[override]
        """kombu's polling drain, which also stops waiting (as its timeout would) once the worker is stopping.
        Without a timeout it waits as kombu's does: its caller expects no timeout."""
        time_start = monotonic()
        cycle = self.cycle
        assert cycle is not None  # made as the connection opens
        polling_interval = self.polling_interval
        if timeout and polling_interval and polling_interval > timeout:
            polling_interval = timeout
        while True:
            if timeout is not None and worker_is_stopping():
                raise TimeoutError()
            try:
                cycle.get(self._deliver, timeout=timeout)
            except Empty:
                if timeout is not None and monotonic() - time_start >= timeout:
                    raise TimeoutError() from None
                if polling_interval is not None:
                    sleep(polling_interval)
            else:
                return
