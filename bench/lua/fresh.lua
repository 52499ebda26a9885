-- SPDX-License-Identifier: Apache-2.0
-- fresh.lua - S1 / S4: POST /api/orders with a new Idempotency-Key on every request, so every
-- request claims a record and creates an order.  Keys are TAG-<thread>-<n>: wrk's Lua state is
-- per thread, so the thread number keeps two threads from sending the same key.
--   wrk -s bench/lua/fresh.lua URL -- TOKEN TAG [NPRODUCTS]
-- With NPRODUCTS the orders go round the products p-bench-0 .. p-bench-(NPRODUCTS-1) (bench.py
-- adds them), each thread starting at its own one, so that no one hot stock row serialises them;
-- without it every order is of p-1024.
package.path = debug.getinfo(1, "S").source:match("^@(.*/)") .. "?.lua;" .. package.path
local common = require("common")

local tag
local nproducts
local n = 0

setup = common.setup
done = common.done

function init(args)
    tag = common.init(args)
    nproducts = tonumber(args[3] or "0")
end

function request()
    n = n + 1
    wrk.headers["Idempotency-Key"] = string.format("%s-%d-%d", tag, tid, n)
    if nproducts > 0 then
        local p = (tid * 7919 + n) % nproducts
        return wrk.format(nil, nil, nil,
            string.format('{"productId":"p-bench-%d","quantity":1}', p))
    end
    return wrk.format()
end
