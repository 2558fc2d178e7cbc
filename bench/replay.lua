-- Replays keys replay-1 .. replay-N (N = BENCH_REPLAY_KEYS, default 1000) that
-- `bench-e2e precreate` created, each with the very request that created it: every answer is
-- the stored 201, marked Idempotency-Replayed. Requests are pre-built and cycled through.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")

local requests = {}
local n = 0
local next_index = 0

function init(args)
   n = tonumber(os.getenv("BENCH_REPLAY_KEYS") or "1000")
   for i = 1, n do
      requests[i] = keyed_request("bench.replay", "replay-", i)
   end
   -- Threads start at different points of the key list.
   next_index = ((thread_id or 1) - 1) * math.floor(n / 2)
end

function request()
   next_index = next_index % n + 1
   return requests[next_index]
end
