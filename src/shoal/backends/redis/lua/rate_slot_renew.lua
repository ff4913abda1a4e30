-- rate_slot_renew: extend a holder's slot, only while it is live.
--
-- KEYS[1]  {prefix}:{ns}:rslots:{key}   hash holder -> expires_at ('%.17g' seconds, the app's
--                                       clock); cleanup expiry only, never shortened
--
-- ARGV[1]  holder
-- ARGV[2]  lease     seconds
-- ARGV[3]  now       seconds, the app's clock (Redis TIME is never read)
-- ARGV[4]  keep      milliseconds of real time the hash outlives this write before it may be
--                    garbage collected (at least 10 x lease and an hour)
--
-- Returns 1 when holder's row had expires_at > now (it now ends at now + lease), else 0 and
-- nothing changed (other holders' ended rows are left to rate_slot_acquire, as in the memory
-- reference).

local holder = ARGV[1]
local now = tonumber(ARGV[3])
local keep = tonumber(ARGV[4])

local ends = tonumber(redis.call('HGET', KEYS[1], holder) or '')
if ends == nil or ends <= now then return 0 end
redis.call('HSET', KEYS[1], holder, string.format('%.17g', now + tonumber(ARGV[2])))
if redis.call('PTTL', KEYS[1]) < keep then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return 1
