-- POST /v1/entries, every request with a fresh Idempotency-Key and a ~110-byte JSON body.
-- Keys: wrk-<BENCH_NONCE>-<thread>-<n>, so they are unique across threads and runs.
-- With BENCH_ORDERING_KEYS=N, request n of each thread is a write of ordering key
-- key-<n mod N> (ordered delivery; the threads share the N keys).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")

local counter = 0
local prefix
local ordering_keys = 0
local headers = { ["Content-Type"] = "application/json" }

function init(args)
   local nonce = os.getenv("BENCH_NONCE") or tostring(os.time())
   prefix = string.format("wrk-%s-%d-", nonce, thread_id or 0)
   ordering_keys = tonumber(os.getenv("BENCH_ORDERING_KEYS") or "0")
end

function request()
   counter = counter + 1
   headers["Idempotency-Key"] = prefix .. counter
   local ordering = ""
   if ordering_keys > 0 then
      ordering = string.format(',"ordering_key":"key-%d"', counter % ordering_keys)
   end
   local body = string.format(
      '{"kind":"bench.write","data":{"seq":%d,"amount":1250,"currency":"EUR","note":"retrysafe benchmark payload"}%s}',
      counter, ordering)
   return wrk.format("POST", "/v1/entries", headers, body)
end
