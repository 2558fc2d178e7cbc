-- GET of the URL given to wrk (/healthz, a listing); only adds the machine-readable summary.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")
