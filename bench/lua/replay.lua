-- SPDX-License-Identifier: Apache-2.0
-- replay.lua - S2, the RSS run, the static ceiling and nginx: POST /api/orders cycling over NKEYS
-- keys TAG-0 .. TAG-<NKEYS-1> that bench.py created before with the same body, so every request
-- to orderd is a replay of a completed record; the static server and nginx get the very same
-- bytes and answer them with a fixed 201.  The threads start at different offsets and all walk
-- every key.
--   wrk -s bench/lua/replay.lua URL -- TOKEN TAG NKEYS
package.path = debug.getinfo(1, "S").source:match("^@(.*/)") .. "?.lua;" .. package.path
local common = require("common")

local tag, nkeys
local n = 0

setup = common.setup
done = common.done

function init(args)
    tag, nkeys = common.init(args)
    if nkeys < 1 then
        nkeys = 1
    end
    n = (tid or 1) * 7919
end

function request()
    n = n + 1
    wrk.headers["Idempotency-Key"] = string.format("%s-%d", tag, n % nkeys)
    return wrk.format()
end
