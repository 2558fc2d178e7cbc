-- POST /v1/entries, every request with a fresh Idempotency-Key and a ~110-byte JSON body.
-- Keys: wrk-<BENCH_NONCE>-<thread>-<n>, so they are unique across threads and runs; with
-- BENCH_KEYS=random, a random UUID (version 4) each, as most clients make them: every write
-- lands at a random place of the key index, where the keys above sort after all earlier ones.
-- With BENCH_ORDERING_KEYS=N, request n of each thread is a write of ordering key
-- key-<n mod N> (ordered delivery; the threads share the N keys). With BENCH_TOKENS=a,b,...,
-- request n is sent with the bearer token number n mod (their number): as many clients.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")

local counter = 0
local prefix
local ordering_keys = 0
local random_keys = false
local tokens = {}
local headers = { ["Content-Type"] = "application/json" }

function init(args)
   local nonce = os.getenv("BENCH_NONCE") or tostring(os.time())
   prefix = string.format("wrk-%s-%d-", nonce, thread_id or 0)
   ordering_keys = tonumber(os.getenv("BENCH_ORDERING_KEYS") or "0")
   random_keys = os.getenv("BENCH_KEYS") == "random"
   for token in string.gmatch(os.getenv("BENCH_TOKENS") or "", "[^,]+") do
      tokens[#tokens + 1] = token
   end
   math.randomseed(os.time() * 1000 + (thread_id or 0) * 7919 + os.clock() * 1e6)
end

local function random_uuid()
   local function hex(n)
      local digits = {}
      for i = 1, n do
         digits[i] = string.format("%x", math.random(0, 15))
      end
      return table.concat(digits)
   end
   return string.format("%s-%s-4%s-%x%s-%s",
      hex(8), hex(4), hex(3), math.random(8, 11), hex(3), hex(12))
end

function request()
   counter = counter + 1
   if random_keys then
      headers["Idempotency-Key"] = random_uuid()
   else
      headers["Idempotency-Key"] = prefix .. counter
   end
   if #tokens > 0 then
      headers["Authorization"] = "Bearer " .. tokens[counter % #tokens + 1]
   end
   local ordering = ""
   if ordering_keys > 0 then
      ordering = string.format(',"ordering_key":"key-%d"', counter % ordering_keys)
   end
   local body = string.format(
      '{"kind":"bench.write","data":{"seq":%d,"amount":1250,"currency":"EUR","note":"retrysafe benchmark payload"}%s}',
      counter, ordering)
   return wrk.format("POST", "/v1/entries", headers, body)
end
