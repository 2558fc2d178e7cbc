-- Replays keys replay-1 .. replay-N (N = BENCH_REPLAY_KEYS, default 1000) that
-- `bench-e2e precreate` created, each with the very request that created it: every answer is
-- the stored 201, marked Idempotency-Replayed. Requests are pre-built and cycled through.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")

local threads = 0
function setup(thread)
   threads = threads + 1
   thread:set("thread_id", threads)
end

local requests = {}
local n = 0
local next_index = 0

function init(args)
   n = tonumber(os.getenv("BENCH_REPLAY_KEYS") or "1000")
   for i = 1, n do
      local body = string.format(
         '{"kind":"bench.replay","data":{"i":%d,"note":"retrysafe benchmark payload"}}', i)
      requests[i] = wrk.format("POST", "/v1/entries",
         { ["Content-Type"] = "application/json", ["Idempotency-Key"] = "replay-" .. i }, body)
   end
   -- Threads start at different points of the key list.
   next_index = ((thread_id or 1) - 1) * math.floor(n / 2)
end

function request()
   next_index = next_index % n + 1
   return requests[next_index]
end
