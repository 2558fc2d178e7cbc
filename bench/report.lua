-- Shared by the wrk scripts in bench/: each thread's number (thread_id, from 1), requests with
-- an idempotency key, and done(), which prints one machine-readable line for bench/run.
-- Latencies are wrk's (closed loop: a slow answer delays that connection's next request).

local threads = 0
function setup(thread)
   threads = threads + 1
   thread:set("thread_id", threads)
end

-- POST /v1/entries (or `path`) with the key <prefix><i> and the body
-- {"kind":<kind>,"data":{"i":<i>,...}} (the body the benchmark creates the same key with).
function keyed_request(kind, prefix, i, path)
   local body = string.format(
      '{"kind":"%s","data":{"i":%d,"note":"retrysafe benchmark payload"}}', kind, i)
   return wrk.format("POST", path or "/v1/entries",
      { ["Content-Type"] = "application/json", ["Idempotency-Key"] = prefix .. i }, body)
end

function done(summary, latency, requests)
   local e = summary.errors
   local us = function(p) return latency:percentile(p) / 1000.0 end
   io.write(string.format(
      'BENCH_RESULT {"requests":%d,"duration_s":%.6f,"rps":%.2f,"p50_ms":%.3f,"p90_ms":%.3f,' ..
      '"p99_ms":%.3f,"mean_ms":%.3f,"max_ms":%.3f,"errors_connect":%d,"errors_read":%d,' ..
      '"errors_write":%d,"errors_status":%d,"errors_timeout":%d}\n',
      summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
      us(50), us(90), us(99), latency.mean / 1000.0, latency.max / 1000.0,
      e.connect, e.read, e.write, e.status, e.timeout))
end
