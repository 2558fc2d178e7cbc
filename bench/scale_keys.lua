-- GET /v1/idempotency-keys/{key}: each request one key of the file BENCH_KEYS_FILE (one key a
-- line: keys that exist), taken in turn from a place of each thread's own.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")

local keys = {}
local next_key = 1

function init(args)
   for line in io.lines(os.getenv("BENCH_KEYS_FILE")) do
      keys[#keys + 1] = line
   end
   next_key = ((thread_id or 1) * 7919) % #keys + 1
end

function request()
   local key = keys[next_key]
   next_key = next_key % #keys + 1
   return wrk.format("GET", "/v1/idempotency-keys/" .. key)
end
