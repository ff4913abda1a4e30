-- rate_pause_until: pause a key until a time, unless it is already paused until later.
--
-- KEYS[1]  {prefix}:{ns}:rpause:{key}   string, the end of the pause ('%.17g' seconds, the app's
--                                       clock); no expiry while it may be in force (see
--                                       rate_paused_until, which sets the cleanup expiry once the
--                                       pause is over)
--
-- ARGV[1]  until     seconds, the app's clock
--
-- Steps: the pause kept is max(stored, until); when until is later it is stored, which also
-- drops any cleanup expiry of an earlier, ended pause (SET without KEEPTTL). The call takes no
-- 'now', so it never sets an expiry itself.
-- Returns the pause in force as a '%.17g' string (reads back exactly).

local until_ = tonumber(ARGV[1])
local stored = tonumber(redis.call('GET', KEYS[1]) or '')
if stored ~= nil and not (until_ > stored) then
  return string.format('%.17g', stored)
end
local text = string.format('%.17g', until_)
redis.call('SET', KEYS[1], text)
return text
