-- SPDX-License-Identifier: Apache-2.0
-- gateway.lua - bench/gateway_bench.py's load: one request shape, sent alike to
-- idem-gateway, to its upstream directly and to nginx's proxy_pass, so the two sides of every
-- ratio get the very same bytes.
--   wrk -s bench/lua/gateway.lua URL -- MODE METHOD PATH CONSUMER KEY
-- MODE   fixed: every request carries "Idempotency-Key: KEY" (after one warm-up request that
--               created the record, each one through the gateway is a replay)
--        fresh: a new key on every request, KEY-<wrk thread>-<n> (as fresh.lua: wrk's Lua state
--               is per thread, so the thread number keeps two threads apart)
--        none:  no Idempotency-Key
-- METHOD POST, PUT and PATCH send common.lua's order body as application/json; others no body.
-- CONSUMER is sent as X-Consumer-Id (the gateway's principal); "-" sends none.
-- The requests of "fixed" and "none" never change, so they are formatted once per thread.
package.path = debug.getinfo(1, "S").source:match("^@(.*/)") .. "?.lua;" .. package.path
local common = require("common")

local mode, key, req
local n = 0

setup = common.setup
done = common.done

function init(args)
    mode = args[1] or "none"
    wrk.method = args[2] or "POST"
    wrk.path = args[3] or "/"
    if wrk.method == "POST" or wrk.method == "PUT" or wrk.method == "PATCH" then
        wrk.body = common.body
        wrk.headers["Content-Type"] = "application/json"
    else
        wrk.body = nil
    end
    if args[4] ~= nil and args[4] ~= "-" then
        wrk.headers["X-Consumer-Id"] = args[4]
    end
    key = args[5] or "bench"
    if mode == "fixed" then
        wrk.headers["Idempotency-Key"] = key
    end
    if mode ~= "fresh" then
        req = wrk.format()
    end
end

function request()
    if mode == "fresh" then
        n = n + 1
        wrk.headers["Idempotency-Key"] = string.format("%s-%d-%d", key, tid, n)
        return wrk.format()
    end
    return req
end
