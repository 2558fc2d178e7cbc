-- GET of the path given to wrk (a listing), with bench/report.lua's machine-readable line.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(dir .. "report.lua")
