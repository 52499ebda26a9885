-- SPDX-License-Identifier: Apache-2.0
-- shards.lua - bench/shards_bench.py's load: POST PATH with a new Idempotency-Key on every
-- request, from many principals round-robin, so that every bucket of a shard set, and so every
-- cluster, gets its share of the keys.
--   wrk -s bench/lua/shards.lua URL -- PATH TAG NPRINCIPALS
-- The principal is sent as X-Consumer-Id: principal-<i>, i = 0 .. NPRINCIPALS-1, each thread
-- starting at its own offset and going round them all.  Keys are TAG-<wrk thread>-<n> (wrk's
-- Lua state is per thread, so the thread number keeps two threads apart), the body common.lua's.
package.path = debug.getinfo(1, "S").source:match("^@(.*/)") .. "?.lua;" .. package.path
local common = require("common")

local tag
local nprincipals
local n = 0

setup = common.setup
done = common.done

function init(args)
    wrk.method = "POST"
    wrk.path = args[1] or "/v1/things"
    wrk.body = common.body
    wrk.headers["Content-Type"] = "application/json"
    tag = args[2] or "shards"
    nprincipals = tonumber(args[3] or "10000")
end

function request()
    n = n + 1
    wrk.headers["X-Consumer-Id"] = string.format("principal-%d",
        (tid * 7919 + n) % nprincipals)
    wrk.headers["Idempotency-Key"] = string.format("%s-%d-%d", tag, tid, n)
    return wrk.format()
end
