-- wrk script: uniform random GETs over /page/1 .. /page/N (N = first script argument, default 20000)
local n = 20000
function init(args)
  if args[1] then n = tonumber(args[1]) end
  math.randomseed(os.time() + (tonumber(tostring({}):sub(8)) or 0))
end
function request()
  return wrk.format("GET", "/page/" .. math.random(1, n))
end
