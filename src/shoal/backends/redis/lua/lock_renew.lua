-- lock_renew: extend a holder's lease on every key, only if it still holds all of them.
--
-- KEYS[i]  {prefix}:{ns}:lock:{k_i}   hash holder, expires_at: the hold of each key
--
-- ARGV[1]  holder
-- ARGV[2]  lease     seconds
-- ARGV[3]  now       seconds, the app's clock
-- ARGV[4]  keep      milliseconds of real time before the hold rows may be garbage collected
--
-- Returns 1 when every key was held by holder with expires_at > now (each now ends at
-- now + lease), else 0 and nothing changed.

local holder = ARGV[1]
local now = tonumber(ARGV[3])
for i = 1, #KEYS do
  local hold = redis.call('HMGET', KEYS[i], 'holder', 'expires_at')
  if hold[1] ~= holder or tonumber(hold[2]) <= now then return 0 end
end
local expires_at = string.format('%.17g', now + tonumber(ARGV[2]))
for i = 1, #KEYS do
  redis.call('HSET', KEYS[i], 'expires_at', expires_at)
  redis.call('PEXPIRE', KEYS[i], ARGV[4])
end
return 1
