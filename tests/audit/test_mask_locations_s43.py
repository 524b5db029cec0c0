"""``mask_internal_locations`` leaves no part of an internal location in an exception's message.

- A quoted path whose parts hold spaces is masked to its closing quote (``'/srv/데이터/설정 파일.yaml'`` kept
  ``파일.yaml``).
- A UNC path (``\\\\fileserver\\hr\\salaries.xlsx``) is masked as a path (it was left whole).
- A private network's host name (``postgres-primary.svc.cluster.local``, ``*.corp.local``, ``*.internal``; with its
  port) is masked as an internal address (it was left whole); a public name that holds such a word is not.
- A long text is masked fast (no regex backtracking that grows with its length).
"""

from __future__ import annotations

import time

import pytest

from audit.masking import mask_internal_locations


@pytest.mark.parametrize(
    "text,masked",
    [
        ("No such file or directory: '/srv/데이터/설정 파일.yaml'", "No such file or directory: '[path]'"),
        ('open "C:\\Program Files\\app\\x.ini" failed', 'open "[path]" failed'),
        ('File "/srv/my app/x.py", line 42, in f', 'File "[path]", in f'),
        ("'/srv/a b/c.txt' and '/srv/e/f'", "'[path]' and '[path]'"),
        ("cannot open \\\\fileserver\\hr\\salaries.xlsx", "cannot open [path]"),
        ("cannot open \\\\nas.corp\\share\\a.txt: denied", "cannot open [path]: denied"),
        (
            'could not translate host name "postgres-primary.svc.cluster.local" to address',
            'could not translate host name "[internal address]" to address',
        ),
        ("connect to hr.corp.local:8080 refused", "connect to [internal address] refused"),
        ("http://ledger.internal:5432/api down", "http://[internal address]/api down"),
        (
            "billing.svc, files.lan and Vault.Corp are down",
            "[internal address], [internal address] and [internal address] are down",
        ),
    ],
)
def test_internal_locations_are_masked_whole(text: str, masked: str) -> None:
    assert mask_internal_locations(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "https://docs.internal.example.com/guide is public",
        "a local file",
        "it's fine, 'ok'",
        "settings.local.py",
    ],
)
def test_what_is_no_internal_location_stays(text: str) -> None:
    assert mask_internal_locations(text) == text


@pytest.mark.parametrize(
    "text",
    [
        "a." * 50_000,
        "/a" * 50_000,
        "'/a" + " b" * 50_000,
        "\\\\a" * 30_000,
        "a-" * 50_000 + "b",
        "'/a/b " * 20_000,
        "//a.b" * 20_000,
    ],
)
def test_a_long_text_is_masked_fast(text: str) -> None:
    started = time.perf_counter()
    mask_internal_locations(text)
    assert time.perf_counter() - started < 2
