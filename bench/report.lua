-- Shared by the wrk scripts in bench/: done() prints one machine-readable line for bench/run.
-- Latencies are wrk's (closed loop: a slow answer delays that connection's next request).

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
