-- The physical baseline of replays (bench/replay.lua): the same requests, keys and bodies, sent
-- to POST /bench/same-bytes (the daemon built with the cargo feature `bench-routes`), which reads
-- them as a write does and answers BENCH_SAME_BYTES bytes (the size of a replay's answer) with a
-- replay's header fields, and does nothing else.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")

local requests = {}
local n = 0
local next_index = 0

function init(args)
   n = tonumber(os.getenv("BENCH_REPLAY_KEYS") or "1000")
   local path = "/bench/same-bytes?bytes=" .. (os.getenv("BENCH_SAME_BYTES") or "400")
   for i = 1, n do
      requests[i] = keyed_request("bench.replay", "replay-", i, path)
   end
   next_index = ((thread_id or 1) - 1) * math.floor(n / 2)
end

function request()
   next_index = next_index % n + 1
   return requests[next_index]
end
