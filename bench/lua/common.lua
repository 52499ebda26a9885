-- SPDX-License-Identifier: Apache-2.0
-- common.lua - what every bench/lua script shares: the order body, the headers, and the one
-- machine-readable summary line (BENCH_JSON {...}) that bench/bench.py reads from wrk's output.
-- wrk gives each of its threads its own Lua state, so per-thread values (the thread number that
-- keeps keys unique, the counters) live in that state; setup() runs in the main state and hands
-- each thread its number.
local M = {}

M.body = '{"productId":"p-1024","quantity":1}'
local nthreads = 0

function M.setup(thread)
    nthreads = nthreads + 1
    thread:set("tid", nthreads)
end

-- args: TOKEN TAG [NKEYS]; TOKEN "-" sends no Authorization (the static ceiling ignores it).
function M.init(args)
    wrk.method = "POST"
    wrk.path = "/api/orders"
    wrk.body = M.body
    wrk.headers["Content-Type"] = "application/json"
    if args[1] ~= nil and args[1] ~= "-" then
        wrk.headers["Authorization"] = "Bearer " .. args[1]
    end
    return args[2] or "bench", tonumber(args[3] or "0")
end

function M.done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"p50_us":%d,"p90_us":%d,' ..
        '"p99_us":%d,"max_us":%d,"mean_us":%.1f,"err_connect":%d,"err_read":%d,' ..
        '"err_write":%d,"err_status":%d,"err_timeout":%d}\n',
        summary.requests, summary.duration, summary.bytes, latency:percentile(50),
        latency:percentile(90), latency:percentile(99), latency.max, latency.mean,
        e.connect, e.read, e.write, e.status, e.timeout))
end

return M
