-- scripts/soak.lua: one 30-second slice of the soak's mixed load (scripts/soak runs it).
--
-- Each request is, at random:
--   70 %  a write with a fresh key          POST /v1/entries            -> 201
--   20 %  a replay of an earlier key         the same key and body again -> 201, Idempotency-Replayed
--    5 %  a conflict on an earlier key       the same key, another body  -> 409 idempotency-key-reused
--    5 %  a GET                              /v1/entries/{id} of a recent 201 (its Location), or
--                                            /v1/idempotency-keys/{key} of a key of an earlier
--                                            slice (never one that may be in flight) -> 200
-- Keys are soak-<SOAK_NONCE>-<slice>-<thread>-<n>; the body of key n is a function of n, so any
-- earlier key can be replayed exactly. "Earlier" is 80 % a key of this slice and 20 % a key of
-- any earlier slice (from SOAK_STATE, which done() appends to), so that some replays are old
-- enough to be read back from PostgreSQL once the replay cache has dropped them. done() leaves
-- out each thread's last STATE_MARGIN keys: they may have been in flight when wrk stopped.
--
-- The rate is held by a fixed-rate schedule: wrk calls delay() before each request of a
-- connection, and delay() hands out the next slot of its thread's schedule, SOAK_INTERVAL_US
-- apart (the driver sets it to threads / SOAK_RATE), returning the time until that slot. An
-- answer's latency therefore does not lower the rate, as a fixed pause after each answer did
-- (that gave connections / (pause + latency)); a late slot is sent at once, so the schedule
-- catches up after a slow answer as far as the thread's connections allow. done() prints one
-- SOAK_RESULT line (JSON) with wrk's figures and the counts by kind and by answer.
--
-- wrk calls request() once more than it sends: before its threads start, it calls the first
-- thread's request() to see how many requests one call returns (script_verify_request in
-- wrk.c), and never sends that one. Every request wrk does send is preceded by a call to
-- delay() (a connection starts out delayed and is delayed again after each answer), so a call
-- to request() before any delay() is that probe: it gets a GET that counts for nothing rather
-- than a fresh key, which would otherwise be counted as written and later read back as a 404.
--
-- Environment: SOAK_NONCE, SOAK_SLICE, SOAK_STATE (file), SOAK_INTERVAL_US (per wrk thread).

-- A monotonic clock in milliseconds (wrk runs LuaJIT; its os.clock is CPU time).
local ffi = require("ffi")
ffi.cdef [[
typedef struct { long tv_sec; long tv_nsec; } soak_timespec;
int clock_gettime(int clock_id, soak_timespec *tp);
]]
local CLOCK_MONOTONIC = 1
local timespec = ffi.new("soak_timespec")
local function now_ms()
   ffi.C.clock_gettime(CLOCK_MONOTONIC, timespec)
   return tonumber(timespec.tv_sec) * 1000 + tonumber(timespec.tv_nsec) / 1e6
end

local threads = {}

function setup(thread)
   table.insert(threads, thread)
   thread:set("thread_id", #threads)
end

local nonce, slice, prefix
-- This thread's schedule: the interval between its requests, and the next free slot.
local interval_ms = 0
local next_slot = nil
-- Calls to delay() so far: 0 while wrk probes request() (see above).
local delays = 0
counter = 0
-- Earlier slices: { prefix, count } pairs, and their total key count.
local earlier, earlier_total = {}, 0
-- Recent Locations of 201s, for GET /v1/entries/{id}.
local locations, location_next, location_count = {}, 0, 0
local LOCATIONS = 256
local STATE_MARGIN = 100
local json = { ["Content-Type"] = "application/json" }

-- Counts, read by done() with thread:get.
sent_write, sent_replay, sent_conflict, sent_get = 0, 0, 0, 0
got_created, got_replayed, got_200, got_reused, got_in_progress = 0, 0, 0, 0, 0
got_503, got_other = 0, 0
last_other = ""

function init(args)
   nonce = os.getenv("SOAK_NONCE") or tostring(os.time())
   slice = tonumber(os.getenv("SOAK_SLICE") or "1")
   interval_ms = tonumber(os.getenv("SOAK_INTERVAL_US") or "0") / 1000
   prefix = string.format("soak-%s-%d-%d-", nonce, slice, thread_id)
   math.randomseed(os.time() * 1000 + slice * 97 + thread_id * 7919)
   local state = os.getenv("SOAK_STATE")
   local file = state and io.open(state, "r")
   if file then
      for line in file:lines() do
         local p, n = line:match("^(%S+) (%d+)$")
         if p and tonumber(n) > 0 then
            table.insert(earlier, { p, tonumber(n) })
            earlier_total = earlier_total + tonumber(n)
         end
      end
      file:close()
   end
end

local function body(n, amount)
   return string.format(
      '{"kind":"soak.write","data":{"n":%d,"amount":%d,"currency":"EUR","note":"retrysafe soak payload"}}',
      n, amount)
end

local function post(key, n, amount)
   json["Idempotency-Key"] = key
   return wrk.format("POST", "/v1/entries", json, body(n, amount))
end

-- A key of an earlier slice: (key, n), or nil when there is none.
local function old_key()
   if earlier_total == 0 then return nil end
   local pick = math.random(1, earlier_total)
   for _, segment in ipairs(earlier) do
      if pick <= segment[2] then
         return segment[1] .. pick, pick
      end
      pick = pick - segment[2]
   end
end

-- An earlier key: (key, n), or nil when there is none yet.
local function earlier_key()
   if earlier_total > 0 and (counter == 0 or math.random() < 0.2) then
      return old_key()
   end
   if counter > 0 then
      local n = math.random(1, counter)
      return prefix .. n, n
   end
   return nil
end

function request()
   if delays == 0 then
      return wrk.format("GET", "/healthz")
   end
   local roll = math.random(1, 100)
   if roll > 70 then
      if roll > 95 then
         local key = old_key()
         if location_count > 0 and (roll <= 97 or not key) then
            sent_get = sent_get + 1
            return wrk.format("GET", locations[math.random(1, location_count)])
         elseif key then
            sent_get = sent_get + 1
            return wrk.format("GET", "/v1/idempotency-keys/" .. key)
         end
      else
         local key, n = earlier_key()
         if key and roll <= 90 then
            sent_replay = sent_replay + 1
            return post(key, n, 1250)
         elseif key then
            sent_conflict = sent_conflict + 1
            return post(key, n, 9999)
         end
      end
   end
   counter = counter + 1
   sent_write = sent_write + 1
   return post(prefix .. counter, counter, 1250)
end

function delay()
   delays = delays + 1
   if interval_ms <= 0 then return 0 end
   local now = now_ms()
   if not next_slot then next_slot = now end
   local slot = next_slot
   next_slot = next_slot + interval_ms
   if slot <= now then return 0 end
   return math.floor(slot - now + 0.5)
end

function response(status, headers, body)
   if status == 201 then
      if headers["idempotency-replayed"] or headers["Idempotency-Replayed"] then
         got_replayed = got_replayed + 1
      else
         got_created = got_created + 1
         local location = headers["location"] or headers["Location"]
         if location then
            location_next = location_next % LOCATIONS + 1
            locations[location_next] = location
            if location_count < LOCATIONS then location_count = location_count + 1 end
         end
      end
   elseif status == 200 then
      got_200 = got_200 + 1
   elseif status == 409 and body and body:find("idempotency-key-reused", 1, true) then
      got_reused = got_reused + 1
   elseif status == 409 then
      got_in_progress = got_in_progress + 1
   elseif status == 503 then
      got_503 = got_503 + 1
   else
      got_other = got_other + 1
      last_other = tostring(status) .. " " .. string.sub(body or "", 1, 200)
   end
end

function done(summary, latency, requests)
   local totals = {}
   local names = { "sent_write", "sent_replay", "sent_conflict", "sent_get", "got_created",
      "got_replayed", "got_200", "got_reused", "got_in_progress", "got_503", "got_other" }
   for _, name in ipairs(names) do totals[name] = 0 end
   local state = os.getenv("SOAK_STATE")
   local file = state and io.open(state, "a")
   local other = ""
   for _, thread in ipairs(threads) do
      for _, name in ipairs(names) do
         totals[name] = totals[name] + (thread:get(name) or 0)
      end
      if file then
         file:write(string.format("soak-%s-%s-%d- %d\n", os.getenv("SOAK_NONCE") or "",
            os.getenv("SOAK_SLICE") or "1", thread:get("thread_id"),
            math.max(0, (thread:get("counter") or 0) - STATE_MARGIN)))
      end
      local last = thread:get("last_other")
      if last and last ~= "" then other = last end
   end
   if file then file:close() end
   local e = summary.errors
   local us = function(p) return latency:percentile(p) / 1000.0 end
   local fields = {}
   for _, name in ipairs(names) do
      table.insert(fields, string.format('"%s":%d', name, totals[name]))
   end
   io.write(string.format(
      'SOAK_RESULT {"requests":%d,"duration_s":%.3f,"rps":%.2f,"p50_ms":%.3f,"p90_ms":%.3f,' ..
      '"p99_ms":%.3f,"max_ms":%.3f,"errors_connect":%d,"errors_read":%d,"errors_write":%d,' ..
      '"errors_status":%d,"errors_timeout":%d,%s}\n',
      summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
      us(50), us(90), us(99), latency.max / 1000.0, e.connect, e.read, e.write, e.status,
      e.timeout, table.concat(fields, ",")))
   if other ~= "" then
      io.write("SOAK_UNEXPECTED " .. other:gsub("\n", " ") .. "\n")
   end
end
