-- rate_paused_until: the end of a key's pause if it is after now; once it is not, a pause key
-- without a cleanup expiry gets one (rate_pause_until gives one to every pause it sets; this
-- covers a key written without it).
--
-- KEYS[1]  {prefix}:{ns}:rpause:{key}   string, the end of the pause ('%.17g' seconds, the app's
--                                       clock)
--
-- ARGV[1]  now       seconds, the app's clock (Redis TIME is never read)
-- ARGV[2]  keep      milliseconds of real time an ended pause is kept before it may be garbage
--                    collected (an hour): only a later pause_until with an earlier 'until' could
--                    tell, and it would answer that earlier, also ended, time
--
-- Returns the stored end as a '%.17g' string when it is after now, else nil (and, if the key
-- has no expiry yet, it expires after keep; a later pause_until that stores a new end sets its
-- own).

local now = tonumber(ARGV[1])
local stored = redis.call('GET', KEYS[1])
if not stored then return false end
local until_ = tonumber(stored)
if until_ ~= nil and until_ > now then return stored end
if redis.call('PTTL', KEYS[1]) == -1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return false
