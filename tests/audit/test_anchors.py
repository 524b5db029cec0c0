"""The chain key (AUDIT_CHAIN_KEY: rotation, the local key file) and anchors outside the database: the JSONL file,
an S3 bucket under object lock (botocore's Stubber, no network), ``manage.py audit_anchor`` and the workers' timer.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import shutil
import stat
import threading
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError

from agent_platform.celery import WorkerTimer
from audit.anchors import AnchorBucket, AnchorTimer, anchors_load, audit_chain_anchor
from audit.archive import audit_events_archive
from audit.chain import ChainKeyring, anchor_message
from audit.chain_keys import chain_keyring
from tests.audit.test_chain import record, sql, verify

pytestmark = pytest.mark.django_db

KEY_A = "a" * 43
KEY_B = "b" * 43


def anchor_command() -> str:
    out = io.StringIO()
    try:
        call_command("audit_anchor", stdout=out)
    except CommandError as exc:
        return f"FAILED: {exc}"
    return out.getvalue().strip()


# --- the key ---------------------------------------------------------------------------------------------------


def test_without_audit_chain_key_a_local_key_is_generated_once_with_mode_0600(settings: Any, tmp_path: Path) -> None:
    settings.AUDIT_CHAIN_KEY = []
    settings.AUDIT_CHAIN_KEY_FILE = tmp_path / "audit_chain_key"

    first = chain_keyring()

    assert stat.S_IMODE(os.stat(settings.AUDIT_CHAIN_KEY_FILE).st_mode) == 0o600
    assert len(settings.AUDIT_CHAIN_KEY_FILE.read_text()) >= 32
    assert chain_keyring().signing_key_id == first.signing_key_id
    assert list(tmp_path.iterdir()) == [settings.AUDIT_CHAIN_KEY_FILE]


def test_a_key_shorter_than_32_characters_is_refused(settings: Any) -> None:
    settings.AUDIT_CHAIN_KEY = ["short"]

    with pytest.raises(ImproperlyConfigured, match="at least 32 characters"):
        chain_keyring()


def test_a_mac_is_the_key_id_and_an_hmac_that_another_purpose_does_not_accept() -> None:
    keyring = ChainKeyring([KEY_A])

    mac = keyring.sign("event", "ab" * 32)

    assert mac.split(":")[0] == keyring.signing_key_id == ChainKeyring.key_id(KEY_A)
    assert len(mac.split(":")[1]) == 64
    assert keyring.check("event", "ab" * 32, mac) is None
    assert keyring.check("head", "ab" * 32, mac) == "MAC mismatch"
    assert ChainKeyring([KEY_B]).check("event", "ab" * 32, mac) == (
        f"MAC by key {keyring.signing_key_id}, which AUDIT_CHAIN_KEY does not hold"
    )


def test_a_rotated_key_signs_what_comes_next_and_the_old_one_still_verifies_what_it_signed(settings: Any) -> None:
    current = settings.AUDIT_CHAIN_KEY or [settings.AUDIT_CHAIN_KEY_FILE.read_text().strip()]
    local = current[0]
    record(2)
    settings.AUDIT_CHAIN_KEY = [KEY_A, *current]

    (event,) = record(1)

    assert event.mac.startswith(ChainKeyring.key_id(KEY_A) + ":")
    assert verify().startswith("verified 3 events")
    settings.AUDIT_CHAIN_KEY = [KEY_A]  # the old key dropped too soon
    assert verify() == (
        f"FAILED: event seq 1 (id {event.pk - 2}): MAC by key {ChainKeyring.key_id(local)}, which AUDIT_CHAIN_KEY "
        "does not hold — forged (written or rewritten without the chain key)"
    )


# --- the anchor file and the command ---------------------------------------------------------------------------


def test_audit_anchor_appends_the_head_as_a_macd_json_line(anchor_file: Path) -> None:
    events = record(3)

    said = anchor_command()
    record(1)
    anchor_command()

    first, second = (json.loads(line) for line in anchor_file.read_text().splitlines())
    assert said == f"anchored seq 3, head {events[-1].hash}, at {first['at']} in anchor file {anchor_file}"
    assert (first["seq"], first["hash"], second["seq"]) == (3, events[-1].hash, 4)
    assert chain_keyring().check("anchor", anchor_message(3, events[-1].hash, first["at"]), first["mac"]) is None
    assert verify().startswith("verified 4 events")


def test_verify_says_where_the_anchors_are_and_which_is_the_latest(anchor_file: Path) -> None:
    record(2)
    out = io.StringIO()
    call_command("verify_audit", stdout=out)
    assert f"no anchors yet in anchor file {anchor_file}" in out.getvalue()

    anchor_command()
    out = io.StringIO()
    call_command("verify_audit", stdout=out)
    assert f"1 anchors in anchor file {anchor_file}, the latest at seq 2 (" in out.getvalue()


def test_nothing_is_anchored_for_a_missing_or_forged_head(anchor_file: Path) -> None:
    events = record(3)
    sql("UPDATE audit_auditchainhead SET seq = 2, hash = %s", [events[1].hash])

    assert anchor_command() == "FAILED: The audit chain head (seq 2) has MAC mismatch: nothing anchored."
    sql("DELETE FROM audit_auditchainhead")
    assert anchor_command() == "FAILED: The audit chain head is missing: nothing anchored."
    assert not anchor_file.exists()


def test_an_unreadable_anchor_file_fails_verification(anchor_file: Path) -> None:
    record(1)
    anchor_command()
    with anchor_file.open("a") as out:
        out.write("not json\n")

    assert verify() == f"FAILED: anchor file {anchor_file} line 2: not JSON — altered"


def test_the_workers_timer_anchors_only_when_the_head_moved(anchor_file: Path) -> None:
    record(2)
    timer = AnchorTimer()

    assert timer() is not None
    assert timer() is None
    record(1)
    assert timer().seq == 3
    assert len(anchor_file.read_text().splitlines()) == 2


def test_a_worker_timer_runs_its_job_at_once_and_again_after_a_failing_pass() -> None:
    passes: list[int] = []
    twice = threading.Event()

    def job() -> None:
        passes.append(len(passes))
        if len(passes) == 2:
            twice.set()
        if len(passes) == 1:
            raise RuntimeError("the first pass fails")

    timer = WorkerTimer("test-timer", 0.01, job)
    timer.start()
    try:
        assert twice.wait(timeout=10)
    finally:
        timer.stop.set()
        timer.thread.join(timeout=10)
    assert passes[:2] == [0, 1]


# --- archives ----------------------------------------------------------------------------------------------------


def test_archived_events_keep_their_mac_and_an_archive_line_rewritten_without_the_key_is_forged(
    tmp_path: Path,
) -> None:
    import gzip

    from audit.chain import event_hash

    record(3)
    archive = audit_events_archive(older_than_days=0, output=tmp_path / "a.jsonl.gz").path
    with gzip.open(archive, "rt") as text:
        lines = [json.loads(line) for line in text]
    assert all(chain_keyring().check("event", line["hash"], line["mac"]) is None for line in lines[:-1])
    lines[2]["actor"] = "intruder"
    lines[2]["hash"] = event_hash({**lines[2], "created_at": dt.datetime.fromisoformat(lines[2]["created_at"])})
    lines[3] = {"checkpoint": {"seq": 3, "hash": lines[2]["hash"]}}
    with gzip.open(archive, "wt") as out:
        out.writelines(json.dumps(line) + "\n" for line in lines)

    out = io.StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("verify_audit", "--archive", str(archive), stdout=out)
    assert str(failed.value) == (
        f"archive {archive}: event seq 3 (id {lines[2]['id']}): MAC mismatch — forged (written or rewritten "
        "without the chain key)"
    )


def test_archives_moved_elsewhere_are_found_with_archive_dir(tmp_path: Path) -> None:
    record(3)
    written = audit_events_archive(older_than_days=0, output=tmp_path / "first" / "a.jsonl.gz").path
    moved = tmp_path / "cold"
    moved.mkdir()
    shutil.move(written, moved / written.name)

    assert verify() == (
        f"FAILED: archive checkpoint seq 3: its archive file {written} is missing (pass --archive-dir where the "
        "archives are kept)"
    )
    assert verify("--archive-dir", str(moved)).startswith("verified 1 events")  # the archive's own event


def test_a_removed_checkpoint_between_two_archives_is_named(tmp_path: Path) -> None:
    record(2)
    audit_events_archive(older_than_days=0, output=tmp_path / "a.jsonl.gz")
    record(2)
    audit_events_archive(older_than_days=0, output=tmp_path / "b.jsonl.gz")
    sql("DELETE FROM audit_auditcheckpoint WHERE seq = 2")

    # The second archive took the first one's own event (seq 3) with the two after it.
    assert verify() == (
        "FAILED: archive checkpoint seq 5: says 3 events archived, but follows seq 0 — a checkpoint before it was removed"
    )


# --- an S3 bucket under object lock --------------------------------------------------------------------------


@pytest.fixture
def s3() -> Any:
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def bucket(client: Any) -> AnchorBucket:
    return AnchorBucket(
        client=client, bucket="audit-anchors", prefix="prod/", lock_mode="COMPLIANCE", retention_days=2557
    )


def test_an_anchor_goes_to_the_bucket_as_an_object_under_compliance_lock(s3: Any) -> None:
    client, stubber = s3
    events = record(2)
    now = dt.datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
    mac_hex = chain_keyring().sign("anchor", anchor_message(2, events[-1].hash, now.isoformat())).replace(":", "-")
    stubber.add_response(
        "put_object",
        {},
        {
            "Bucket": "audit-anchors",
            "Key": f"prod/{2:020d}-{events[-1].hash}-20260301T120000123456Z-{mac_hex}.json",
            "Body": ANY,
            "ContentType": "application/json",
            "ContentMD5": ANY,
            "ObjectLockMode": "COMPLIANCE",
            "ObjectLockRetainUntilDate": now + dt.timedelta(days=2557),
        },
    )

    anchor = audit_chain_anchor(store=bucket(client), now=now)

    assert (anchor.seq, anchor.hash, anchor.at) == (2, events[-1].hash, "2026-03-01T12:00:00.123456+00:00")


def test_verify_reads_the_anchors_from_the_bucket_listing_alone(s3: Any, settings: Any) -> None:
    client, stubber = s3
    events = record(3)
    at = "2026-03-01T12:00:00.123456+00:00"
    mac = chain_keyring().sign("anchor", anchor_message(3, events[-1].hash, at))
    key = f"prod/{3:020d}-{events[-1].hash}-20260301T120000123456Z-{mac.replace(':', '-')}.json"
    listing = {"Contents": [{"Key": key}], "IsTruncated": False}
    stubber.add_response("list_objects_v2", listing, {"Bucket": "audit-anchors", "Prefix": "prod/"})

    anchors = anchors_load(bucket(client), chain_keyring())

    assert anchors.problem is None
    assert (anchors.latest.seq, anchors.latest.hash, anchors.latest.at) == (3, events[-1].hash, at)
    assert anchors.description == "anchor bucket s3://audit-anchors/prod/"


def test_a_bucket_object_that_is_not_an_anchor_fails_verification(s3: Any) -> None:
    client, stubber = s3
    stubber.add_response(
        "list_objects_v2",
        {"Contents": [{"Key": "prod/notes.txt"}], "IsTruncated": False},
        {"Bucket": ANY, "Prefix": ANY},
    )

    anchors = anchors_load(bucket(client), chain_keyring())

    assert anchors.problem == "anchor bucket s3://audit-anchors/prod/: object prod/notes.txt is not an anchor — altered"


def test_an_unreachable_bucket_fails_verification_rather_than_skipping_the_anchors(s3: Any) -> None:
    client, stubber = s3
    stubber.add_client_error("list_objects_v2", service_error_code="AccessDenied", http_status_code=403)

    anchors = anchors_load(bucket(client), chain_keyring())

    assert anchors.problem is not None
    assert anchors.problem.startswith("anchor bucket s3://audit-anchors/prod/: unreadable (")


def test_an_anchor_problem_is_said_in_the_readers_language(anchor_file: Path) -> None:
    """The anchors' problems were English in a Korean installation (its note read "anchor file … 의 앵커 1개")."""
    from django.utils import translation

    record(1)
    anchor_command()
    with anchor_file.open("a") as out:
        out.write("not json\n")
    with translation.override("ko"):
        said = verify()
    assert said == f"FAILED: 앵커 파일 {anchor_file} 2행: JSON이 아님 — 변조됨"
