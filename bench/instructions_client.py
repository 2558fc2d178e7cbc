#!/usr/bin/env python3
"""bench/instructions' client: N requests of one kind, one after another, on one keep-alive
connection, each checked: python3 instructions_client.py PORT KIND N [KEY_PREFIX]

KIND: healthz | create (fresh keys KEY_PREFIX<n>, default "in-") | replay-same (the very bytes
that created key n) | replay-respaced (key n's request, spaced and ordered differently: parsed
and judged by its canonical hash)."""
import http.client
import sys

port, kind, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
prefix = sys.argv[4] if len(sys.argv) > 4 else "in-"


def body(n):
    return ('{"kind":"bench.write","data":{"seq":%d,"amount":1250,"currency":"EUR",'
            '"note":"retrysafe benchmark payload"}}' % n)


def respaced(n):
    return ('{ "data" : { "note" : "retrysafe benchmark payload", "currency" : "EUR", '
            '"amount" : 1250, "seq" : %d }, "kind" : "bench.write" }' % n)


expected = {"healthz": (200, None), "create": (201, None),
            "replay-same": (201, "true"), "replay-respaced": (201, "true")}[kind]
connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
for n in range(count):
    if kind == "healthz":
        connection.request("GET", "/healthz")
    else:
        connection.request("POST", "/v1/entries",
                           body=respaced(n) if kind == "replay-respaced" else body(n),
                           headers={"Content-Type": "application/json",
                                    "Idempotency-Key": prefix + str(n)})
    response = connection.getresponse()
    response.read()
    got = (response.status, response.getheader("Idempotency-Replayed"))
    if got != expected:
        sys.exit("%s %d: got %s, expected %s" % (kind, n, got, expected))
