-- lock_release: delete whatever a holder has on some keys (its hold, its waiter rows) and
-- announce each key that changed on its channel.
--
-- for each key k (i = 0 .. n-1, n = #KEYS / 3):
-- KEYS[1 + 3i]  {prefix}:{ns}:lock:{k}      hash holder, expires_at: deleted if held by holder
-- KEYS[2 + 3i]  {prefix}:{ns}:queue:{k}     sorted set holder -> ticket: holder removed
-- KEYS[3 + 3i]  {prefix}:{ns}:waiting:{k}   hash holder -> expires_at: holder removed
-- (the fence counter {prefix}:{ns}:fence:{k} is not touched: tokens keep increasing)
--
-- ARGV[1]      holder
-- ARGV[1 + j]  the pub/sub channel of key j ({prefix}:{ns}:changed:{k}); receives 'released'
--              when something of holder's was deleted on that key
--
-- Returns the number of keys that changed.

local holder = ARGV[1]
local changed = 0
for i = 0, #KEYS / 3 - 1 do
  local lock, queue, waiting = KEYS[1 + 3 * i], KEYS[2 + 3 * i], KEYS[3 + 3 * i]
  local gone = 0
  if redis.call('HGET', lock, 'holder') == holder then
    gone = gone + redis.call('DEL', lock)
  end
  gone = gone + redis.call('ZREM', queue, holder)
  gone = gone + redis.call('HDEL', waiting, holder)
  if gone > 0 then
    changed = changed + 1
    redis.call('PUBLISH', ARGV[2 + i], 'released')
  end
end
return changed
