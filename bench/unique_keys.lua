-- POST /v1/entries, every request with a fresh Idempotency-Key and a ~110-byte JSON body.
-- Keys: wrk-<BENCH_NONCE>-<thread>-<n>, so they are unique across threads and runs.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")

local counter = 0
local prefix
local headers = { ["Content-Type"] = "application/json" }

function init(args)
   local nonce = os.getenv("BENCH_NONCE") or tostring(os.time())
   prefix = string.format("wrk-%s-%d-", nonce, thread_id or 0)
end

function request()
   counter = counter + 1
   headers["Idempotency-Key"] = prefix .. counter
   local body = string.format(
      '{"kind":"bench.write","data":{"seq":%d,"amount":1250,"currency":"EUR","note":"retrysafe benchmark payload"}}',
      counter)
   return wrk.format("POST", "/v1/entries", headers, body)
end
