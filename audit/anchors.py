"""Anchors: the chain head (seq, hash, time, MAC) written outside the database, where someone who can rewrite
the database cannot rewrite what was written (``manage.py audit_anchor``, and every worker on a timer).

``verify_audit`` reads every anchor back: each must carry a valid MAC, the chain must still hold each anchored
seq with the anchored hash (in the table or in the archive files), and it must reach the highest anchored seq.
So a record that was emptied, cut short or rewritten up to the latest anchor fails verification, whatever was
done to the database, events, head and checkpoints together.

Two stores, chosen by the settings (:func:`anchor_store`):

* :class:`AnchorFile` (default ``AUDIT_ANCHOR_PATH``, ``var/audit_anchors.jsonl``): one JSON line per anchor,
  ``{"at", "hash", "mac", "seq"}``, appended with ``O_APPEND`` and synced. Put it on storage the database's
  users cannot write, and make it append-only there (``chattr +a``).
* :class:`AnchorBucket` (``AUDIT_ANCHOR_S3_BUCKET``): one object per anchor in an S3-compatible bucket with object
  lock, written with a retention date (``AUDIT_ANCHOR_S3_LOCK_MODE``, default ``COMPLIANCE``, for
  ``AUDIT_ANCHOR_S3_RETENTION_DAYS``) so that nobody, the bucket's owner included, can delete or overwrite it
  before then. The object's key carries the whole anchor, so verifying needs a listing, not a read per object.
"""

from __future__ import annotations

import base64
import datetime as dt
import errno
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings
from django.utils import timezone
from django.utils.translation import gettext as _

from agent_platform.errors import ApplicationError
from agent_platform.os_errors import os_error_text
from audit.chain import GENESIS_HASH, ChainKeyring, MacProblem, anchor_message, checkpoint_message, head_message
from audit.chain_keys import chain_keyring
from audit.models import AuditChainHead, AuditCheckpoint, AuditEvent

__all__ = [
    "Anchor",
    "AnchorBucket",
    "AnchorFile",
    "AnchorSet",
    "AnchorStore",
    "AnchorTimer",
    "AnchorUnreadable",
    "anchor_store",
    "anchors_load",
    "audit_chain_anchor",
    "file_unwritable",
    "parent_folder_make",
]


@dataclass(frozen=True)
class Anchor:
    """The head at one moment: ``at`` is ISO 8601 in UTC with microseconds, ``mac`` covers seq, hash and at."""

    seq: int
    hash: str
    at: str
    mac: str

    def line(self) -> str:
        return json.dumps({"at": self.at, "hash": self.hash, "mac": self.mac, "seq": self.seq}, sort_keys=True)


class AnchorUnreadable(Exception):
    """An entry of the store is not an anchor (or the store cannot be read): verification fails on it."""


class AnchorStore(Protocol):
    """Somewhere outside the database that anchors are appended to and never changed in."""

    description: str

    def append(self, anchor: Anchor) -> None: ...

    def read(self) -> Iterator[Anchor]:
        """Every anchor written, in no promised order; raises :class:`AnchorUnreadable`."""
        ...


def mac_words(why: str) -> str:
    """Why a MAC does not verify (:meth:`audit.chain.ChainKeyring.check`), in the active language."""
    if not isinstance(why, MacProblem):
        return why
    if why.reason == "missing":
        return _("no MAC")
    if why.reason == "unknown_key":
        return _("MAC by key %(key_id)s, which AUDIT_CHAIN_KEY does not hold") % {"key_id": why.key_id}
    if why.reason == "mismatch":
        return _("MAC mismatch")
    return str(why)


def _anchor_from(value: Any, where: str) -> Anchor:
    try:
        anchor = Anchor(seq=value["seq"], hash=value["hash"], at=value["at"], mac=value["mac"])
    except (KeyError, TypeError) as exc:
        raise AnchorUnreadable(_("%(where)s: not an anchor") % {"where": where}) from exc
    if not isinstance(anchor.seq, int) or not all(isinstance(v, str) for v in (anchor.hash, anchor.at, anchor.mac)):
        raise AnchorUnreadable(_("%(where)s: not an anchor") % {"where": where})
    return anchor


def parent_folder_make(path: Path) -> None:
    """Create the folder ``path`` goes in, and those above it. Raises OSError; a file where that folder should be
    is told as a part of the path that is not a folder (``mkdir`` says the name "exists already")."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path.parent)) from exc


def file_unwritable(path: Path, exc: OSError) -> ApplicationError:
    """The refusal of a command that cannot write ``path``: the path and the reason in the reader's language (as
    ``export_config -o`` says it), instead of a traceback."""
    return ApplicationError(
        _("cannot write %(path)s: %(why)s") % {"path": path, "why": os_error_text(exc)}, code="file_unwritable"
    )


class AnchorFile:
    """Anchors as lines of a JSONL file, appended (``O_APPEND``) and synced to disk one by one."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.description = _("anchor file %(path)s") % {"path": self.path}

    def append(self, anchor: Anchor) -> None:
        """Raises ApplicationError where the file cannot be written (``AUDIT_ANCHOR_PATH`` a folder, or under a
        file, or not permitted), naming it and why."""
        try:
            parent_folder_make(self.path)
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        except OSError as exc:
            raise file_unwritable(self.path, exc) from exc
        try:
            os.write(descriptor, (anchor.line() + "\n").encode("utf-8"))
            os.fsync(descriptor)
        except OSError as exc:
            raise file_unwritable(self.path, exc) from exc
        finally:
            os.close(descriptor)

    def read(self) -> Iterator[Anchor]:
        if not self.path.exists():
            return
        try:
            with self.path.open(encoding="utf-8") as lines:
                for number, text in enumerate(lines, start=1):
                    where = _("%(store)s line %(line)s") % {"store": self.description, "line": number}
                    try:
                        value = json.loads(text)
                    except ValueError as exc:
                        raise AnchorUnreadable(_("%(where)s: not JSON") % {"where": where}) from exc
                    yield _anchor_from(value, where)
        except (OSError, UnicodeDecodeError) as exc:
            raise AnchorUnreadable(
                _("%(store)s: unreadable (%(error)s)") % {"store": self.description, "error": exc}
            ) from exc


_KEY = re.compile(
    r"(?P<seq>[0-9]{20})-(?P<hash>[0-9a-f]{64})-(?P<stamp>[0-9]{8}T[0-9]{12}Z)-(?P<kid>[0-9a-f]{8})-(?P<digest>[0-9a-f]{64})\.json"
)


class AnchorBucket:
    """Anchors as objects under object lock in an S3-compatible bucket, one per anchor, named
    ``<prefix><seq, 20 digits>-<hash>-<time>-<key id>-<MAC>.json`` (the object holds the same as JSON)."""

    def __init__(self, *, client: Any, bucket: str, prefix: str, lock_mode: str, retention_days: int) -> None:
        self.client, self.bucket, self.prefix = client, bucket, prefix
        self.lock_mode, self.retention_days = lock_mode, retention_days
        self.description = _("anchor bucket s3://%(bucket)s/%(prefix)s") % {"bucket": bucket, "prefix": prefix}

    def key(self, anchor: Anchor) -> str:
        stamp = dt.datetime.fromisoformat(anchor.at).astimezone(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        key_id, _, digest = anchor.mac.partition(":")
        return f"{self.prefix}{anchor.seq:020d}-{anchor.hash}-{stamp}-{key_id}-{digest}.json"

    def append(self, anchor: Anchor) -> None:
        body = (anchor.line() + "\n").encode("utf-8")
        retain_until = dt.datetime.fromisoformat(anchor.at) + dt.timedelta(days=self.retention_days)
        self.client.put_object(
            Bucket=self.bucket,
            Key=self.key(anchor),
            Body=body,
            ContentType="application/json",
            # Object lock requires an integrity header on the PUT; Content-MD5 is the one every S3-compatible store takes.
            ContentMD5=base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode("ascii"),
            ObjectLockMode=self.lock_mode,
            ObjectLockRetainUntilDate=retain_until,
        )

    def read(self) -> Iterator[Anchor]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                for entry in page.get("Contents", []):
                    yield self._anchor_of(entry["Key"])
        except (BotoCoreError, ClientError) as exc:
            raise AnchorUnreadable(
                _("%(store)s: unreadable (%(error)s)") % {"store": self.description, "error": exc}
            ) from exc

    def _anchor_of(self, key: str) -> Anchor:
        found = _KEY.fullmatch(key[len(self.prefix) :]) if key.startswith(self.prefix) else None
        if found is None:
            raise AnchorUnreadable(
                _("%(store)s: object %(key)s is not an anchor") % {"store": self.description, "key": key}
            )
        at = dt.datetime.strptime(found["stamp"], "%Y%m%dT%H%M%S%fZ").replace(tzinfo=dt.UTC)
        return Anchor(
            seq=int(found["seq"]),
            hash=found["hash"],
            at=at.isoformat(timespec="microseconds"),
            mac=f"{found['kid']}:{found['digest']}",
        )


def anchor_store() -> AnchorStore:
    """The configured store: the bucket where ``AUDIT_ANCHOR_S3_BUCKET`` is set, else the file."""
    if settings.AUDIT_ANCHOR_S3_BUCKET:
        import boto3

        client = boto3.client(
            "s3", endpoint_url=settings.AUDIT_ANCHOR_S3_ENDPOINT_URL, region_name=settings.AUDIT_ANCHOR_S3_REGION
        )
        return AnchorBucket(
            client=client,
            bucket=settings.AUDIT_ANCHOR_S3_BUCKET,
            prefix=settings.AUDIT_ANCHOR_S3_PREFIX,
            lock_mode=settings.AUDIT_ANCHOR_S3_LOCK_MODE,
            retention_days=settings.AUDIT_ANCHOR_S3_RETENTION_DAYS,
        )
    return AnchorFile(settings.AUDIT_ANCHOR_PATH)


# --- writing ---------------------------------------------------------------------------------------------------


def audit_chain_anchor(*, store: AnchorStore | None = None, now: dt.datetime | None = None) -> Anchor:
    """Write the chain head as it is now to the anchor store, MAC'd, and return the anchor.

    Refuses (``ApplicationError``, nothing written) where the head cannot be vouched for: missing, its MAC
    invalid, or not the hash of an event (or archive checkpoint) that carries a valid MAC. It does not walk
    the chain (``verify_audit`` does): an anchor pins what is there, and a later verification checks it all.
    """
    keyring = chain_keyring()
    head = AuditChainHead.objects.filter(pk=1).values_list("seq", "hash", "mac").first()
    if head is None:
        raise ApplicationError(_("The audit chain head is missing: nothing anchored."), code="audit_head_missing")
    seq, hash_hex, mac = head
    why = keyring.check("head", head_message(seq, hash_hex), mac)
    if why is not None:
        raise ApplicationError(
            _("The audit chain head (seq %(seq)s) has %(why)s: nothing anchored.") % {"seq": seq, "why": why},
            code="audit_head_forged",
        )
    if not _head_is_vouched_for(keyring, seq, hash_hex):
        raise ApplicationError(
            _("The audit chain head (seq %(seq)s) is not an authenticated event's hash: nothing anchored.")
            % {"seq": seq},
            code="audit_head_forged",
        )
    at = (now or timezone.now()).astimezone(dt.UTC).isoformat(timespec="microseconds")
    anchor = Anchor(seq=seq, hash=hash_hex, at=at, mac=keyring.sign("anchor", anchor_message(seq, hash_hex, at)))
    (store or anchor_store()).append(anchor)
    return anchor


def _head_is_vouched_for(keyring: ChainKeyring, seq: int, hash_hex: str) -> bool:
    if seq == 0:
        return hash_hex == GENESIS_HASH
    event = AuditEvent.objects.filter(seq=seq).values_list("hash", "mac").first()
    if event is not None:
        return event[0] == hash_hex and keyring.check("event", hash_hex, event[1]) is None
    checkpoint = AuditCheckpoint.objects.filter(seq=seq).values_list("hash", "count", "mac").first()
    return (
        checkpoint is not None
        and checkpoint[0] == hash_hex
        and keyring.check("checkpoint", checkpoint_message(seq, hash_hex, checkpoint[1]), checkpoint[2]) is None
    )


class AnchorTimer:
    """A worker's anchoring pass (``agent_platform.celery``): anchors the head when it moved since this timer's
    last anchor, so that an idle platform does not fill the store. Raises what :func:`audit_chain_anchor` raises."""

    def __init__(self) -> None:
        self.last: Anchor | None = None

    def __call__(self) -> Anchor | None:
        head = AuditChainHead.objects.filter(pk=1).values_list("seq", "hash").first()
        if self.last is not None and head == (self.last.seq, self.last.hash):
            return None
        self.last = audit_chain_anchor()
        return self.last


# --- reading, for verification -----------------------------------------------------------------------------------


@dataclass
class AnchorSet:
    """The anchors read back and checked: ``by_seq`` (one hash per seq), the ``latest`` (highest seq), or the
    first ``problem`` (unreadable entry, MAC that does not verify, two anchors that disagree)."""

    description: str
    count: int = 0
    by_seq: dict[int, Anchor] = field(default_factory=dict)
    latest: Anchor | None = None
    problem: str | None = None

    def label(self, anchor: Anchor) -> str:
        return f"anchor of {anchor.at}"


def anchors_load(store: AnchorStore, keyring: ChainKeyring) -> AnchorSet:
    """Read every anchor of ``store`` and check its MAC. Never raises for a bad store: see ``problem``."""
    anchors = AnchorSet(description=store.description)
    try:
        for anchor in store.read():
            why = keyring.check("anchor", anchor_message(anchor.seq, anchor.hash, anchor.at), anchor.mac)
            if why is not None:
                anchors.problem = _("%(store)s: the anchor of %(at)s (seq %(seq)s) has %(why)s — forged") % {
                    "store": store.description,
                    "at": anchor.at,
                    "seq": anchor.seq,
                    "why": mac_words(why),
                }
                return anchors
            same = anchors.by_seq.get(anchor.seq)
            if same is not None and same.hash != anchor.hash:
                anchors.problem = _(
                    "%(store)s: the anchors of %(first)s and %(second)s disagree on seq %(seq)s — the chain was "
                    "rewritten between them"
                ) % {"store": store.description, "first": same.at, "second": anchor.at, "seq": anchor.seq}
                return anchors
            anchors.by_seq.setdefault(anchor.seq, anchor)
            anchors.count += 1
            if anchors.latest is None or anchor.seq > anchors.latest.seq:
                anchors.latest = anchor
    except AnchorUnreadable as exc:
        anchors.problem = _("%(problem)s — altered") % {"problem": exc}
    return anchors
