-- rate_pause_until: pause a key until a time, unless it is already paused until later.
--
-- KEYS[1]  {prefix}:{ns}:rpause:{key}   string, the end of the pause ('%.17g' seconds, the app's
--                                       clock); cleanup expiry: the pause's length (until - now,
--                                       in real time) and keep after it
--
-- ARGV[1]  until     seconds, the app's clock
-- ARGV[2]  now       seconds, the app's clock, when the pause is set (Redis TIME is never read)
-- ARGV[3]  keep      milliseconds of real time an ended pause is kept before it may be garbage
--                    collected (an hour): only a later pause_until with an earlier 'until'
--                    could tell, and it would answer that earlier, also ended, time
--
-- Steps: the pause kept is max(stored, until); when until is later it is stored with a cleanup
-- expiry of (until - now) + keep, so a pause that is never read again still goes. An earlier
-- until changes nothing (the expiry of the pause in force stays).
-- Returns the pause in force as a '%.17g' string (reads back exactly).

local until_ = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
local keep = tonumber(ARGV[3])
local stored = tonumber(redis.call('GET', KEYS[1]) or '')
if stored ~= nil and not (until_ > stored) then
  return string.format('%.17g', stored)
end
local text = string.format('%.17g', until_)
local ms = math.floor(math.max(0, until_ - now) * 1000) + keep
redis.call('SET', KEYS[1], text, 'PX', string.format('%d', math.min(ms, 1e15)))
return text
