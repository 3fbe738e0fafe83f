"""`StampedLookup`: values remembered per (path, mtime, size), in memory and in the cache root."""

from __future__ import annotations

import json
import os

import pytest

from xlakern import _cache
from xlakern._stamped_lookup import Stamped, StampedLookup


def encode(known: Stamped) -> object:
    return [known.mtime_ns, known.size, known.value, known.computed_at_ns]


def decode(entry: object) -> Stamped | None:
    if isinstance(entry, list) and len(entry) == 4 and isinstance(entry[2], str):
        return Stamped(*entry)
    return None


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setattr(_cache, "cache_root", lambda: tmp_path / "cache")
    return tmp_path / "cache"


def test_value_holds_until_the_stamp_changes_and_survives_a_fresh_lookup(cache_root, tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("one")
    old = os.stat(f)
    lookup = StampedLookup("values.json", encode, decode)
    assert lookup.get(str(f), old) is None
    lookup.put(str(f), old, "v1")
    lookup.save()
    assert lookup.get(str(f), old) == "v1"
    fresh = StampedLookup("values.json", encode, decode)  # what a new process reads
    assert fresh.get(str(f), old) == "v1"
    f.write_text("three")
    os.utime(f, ns=(old.st_mtime_ns + 10**9, old.st_mtime_ns + 10**9))
    assert fresh.get(str(f), os.stat(f)) is None


def test_racily_clean_values_are_not_trusted(cache_root, tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("x")
    st = os.stat(f)
    lookup = StampedLookup("values.json", encode, decode, racy_ns=2 * 10**9)
    lookup.put(str(f), st, "just hashed", computed_at_ns=st.st_mtime_ns + 10**9)
    assert lookup.get(str(f), st) is None  # computed too close to the mtime
    lookup.put(str(f), st, "hashed later", computed_at_ns=st.st_mtime_ns + 3 * 10**9)
    assert lookup.get(str(f), st) == "hashed later"


def test_entries_of_the_wrong_shape_are_dropped_and_save_only_writes_changes(cache_root, tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("x")
    st = os.stat(f)
    cache_root.mkdir()
    (cache_root / "values.json").write_text(json.dumps({str(f): {"not": "a list"}}))
    lookup = StampedLookup("values.json", encode, decode)
    assert lookup.get(str(f), st) is None
    assert json.loads((cache_root / "values.json").read_text()) == {}  # healed as it was read
    (cache_root / "values.json").unlink()
    lookup.save()  # nothing remembered: nothing written
    assert not (cache_root / "values.json").exists()
