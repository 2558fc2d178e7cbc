-- GET /healthz (the URL given to wrk); only adds the machine-readable summary.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")
