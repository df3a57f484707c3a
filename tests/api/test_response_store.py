"""The stored-responses contract on SQLite: whole records, owners, a bounded size, a restart."""

from __future__ import annotations

from llmserve.api.response_store import SQLiteResponseStore, StoredResponse


def _rec(i: int, owner: str = "o") -> StoredResponse:
    return StoredResponse(f"resp_{i}", owner, {"id": f"resp_{i}", "output": [i]}, [{"role": "user", "content": str(i)}],
                          float(i))


def test_put_get_delete_and_a_reopen(tmp_path):
    path = tmp_path / "r.db"
    s = SQLiteResponseStore(path, max_age_s=1e12)  # the records are dated 1970
    s.put(_rec(1))
    assert s.get("resp_1") == _rec(1)
    assert SQLiteResponseStore(path, max_age_s=1e12).get("resp_1") == _rec(1)  # what a restarted gateway reads
    assert s.delete("resp_1") and not s.delete("resp_1") and s.get("resp_1") is None


def test_the_oldest_go_past_the_cap(tmp_path):
    s = SQLiteResponseStore(max_records=3, max_age_s=1e12)
    for i in range(1, 6):
        s.put(_rec(i))
    assert [s.get(f"resp_{i}") is not None for i in range(1, 6)] == [False, False, True, True, True]
