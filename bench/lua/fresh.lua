-- fresh.lua - S1 / S4: POST /api/orders with a new Idempotency-Key on every request, so every
-- request claims a record and creates an order.  Keys are TAG-<thread>-<n>: wrk's Lua state is
-- per thread, so the thread number keeps two threads from sending the same key.
--   wrk -s bench/lua/fresh.lua URL -- TOKEN TAG
package.path = debug.getinfo(1, "S").source:match("^@(.*/)") .. "?.lua;" .. package.path
local common = require("common")

local tag
local n = 0

setup = common.setup
done = common.done

function init(args)
    tag = common.init(args)
end

function request()
    n = n + 1
    wrk.headers["Idempotency-Key"] = string.format("%s-%d-%d", tag, tid, n)
    return wrk.format()
end
