-- Duplicate storm: every request carries one of only BENCH_STORM_KEYS (default 10) keys,
-- storm-1 .. storm-K, chosen at random; each key always comes with the same body, so every
-- answer is the one 201 of that key (first write, a wait on the in-flight write, or a replay).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")

local requests = {}
local k = 10

function init(args)
   k = tonumber(os.getenv("BENCH_STORM_KEYS") or "10")
   math.randomseed(os.time() + 7919 * (thread_id or 0))
   for i = 1, k do
      requests[i] = keyed_request("bench.storm", "storm-", i)
   end
end

function request()
   return requests[math.random(1, k)]
end
