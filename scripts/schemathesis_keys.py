#!/usr/bin/env python3
"""Compares the idempotency records in the database with what schemathesis was answered.

    schemathesis_keys.py HAR_FILE DB_KEYS_FILE

HAR_FILE is schemathesis's `--report har` output; DB_KEYS_FILE holds one key per line
(`SELECT key FROM idempotency_records`). A record must exist exactly for the keys whose
`POST /v1/entries` got a 201: a key in the database without a 201 was written by a request that
was refused (or whose answer schemathesis never got), and a 201 without a record was a lie.

The key is read from the request's `Idempotency-Key` header the way the daemon reads it
(src/idempotency/key.rs): surrounding white space dropped by the HTTP parser, then a
structured-field string ("abc", with \\" and \\\\ escapes) unquoted. Prints a summary and
exits 1 on any difference.
"""

import json
import sys
from collections import Counter


def daemon_key(raw):
    """The key the daemon stores for a header value, or None if it would refuse it."""
    value = raw.strip(" \t")
    if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
        out = []
        chars = iter(value[1:-1])
        for char in chars:
            if char == "\\":
                escaped = next(chars, None)
                if escaped not in ('"', "\\"):
                    return None
                out.append(escaped)
            elif char == '"':
                return None
            else:
                out.append(char)
        value = "".join(out)
    if not 1 <= len(value) <= 255 or not all(0x21 <= ord(c) <= 0x7E for c in value):
        return None
    return value


def main():
    har_path, db_keys_path = sys.argv[1], sys.argv[2]
    with open(har_path, encoding="utf-8") as file:
        har = json.load(file)
    with open(db_keys_path, encoding="utf-8") as file:
        db_keys = [line.rstrip("\n") for line in file if line.rstrip("\n")]

    statuses = Counter()
    created = set()
    posts = 0
    unreadable = 0
    for entry in har["log"]["entries"]:
        request, response = entry["request"], entry.get("response") or {}
        status = response.get("status", 0)
        statuses[(request["method"], status)] += 1
        if request["method"] != "POST" or not request["url"].split("?")[0].endswith("/v1/entries"):
            continue
        posts += 1
        if status != 201:
            continue
        values = [h["value"] for h in request["headers"] if h["name"].lower() == "idempotency-key"]
        key = daemon_key(values[0]) if len(values) == 1 else None
        if key is None:
            unreadable += 1
            print(f"a 201 for a request whose key the daemon should have refused: {values!r}")
            continue
        created.add(key)

    print("answers by method and status: " + ", ".join(
        f"{method} {status or 'no answer'}: {n}" for (method, status), n in sorted(statuses.items())))
    in_db = set(db_keys)
    written_without_201 = sorted(in_db - created)
    lied = sorted(created - in_db)
    print(f"POST /v1/entries: {posts} requests, {len(created)} distinct keys answered 201; "
          f"{len(db_keys)} idempotency records ({len(in_db)} distinct keys)")
    for key in written_without_201[:20]:
        print(f"a record for a key that never got a 201: {key!r}")
    for key in lied[:20]:
        print(f"a 201 without a record: {key!r}")
    ok = not written_without_201 and not lied and not unreadable and len(in_db) == len(db_keys)
    print("keys: " + ("records = keys answered 201" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
