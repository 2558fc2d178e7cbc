-- Replays keys replay-1 .. replay-N (N = BENCH_REPLAY_KEYS, default 1000) that the benchmark
-- created, each with the very request that created it: every answer is the stored 201, marked
-- Idempotency-Replayed. Requests are pre-built and cycled through. With BENCH_SAME_BYTES=B, the
-- replays' physical baseline: the same requests to POST /bench/same-bytes (the daemon built
-- with the cargo feature `bench-routes`), which reads them as a write does and answers B bytes
-- (the size of a replay's answer) with a replay's header fields, and does nothing else.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")

local requests = {}
local n = 0
local next_index = 0

function init(args)
   n = tonumber(os.getenv("BENCH_REPLAY_KEYS") or "1000")
   local bytes = os.getenv("BENCH_SAME_BYTES")
   local path = bytes and ("/bench/same-bytes?bytes=" .. bytes) or nil
   for i = 1, n do
      requests[i] = keyed_request("bench.replay", "replay-", i, path)
   end
   -- Threads start at different points of the key list.
   next_index = ((thread_id or 1) - 1) * math.floor(n / 2)
end

function request()
   next_index = next_index % n + 1
   return requests[next_index]
end
