-- lock_release: delete whatever a holder has on some keys (its hold, its waiter rows), and wake
-- the waiter that is now next: on each key where the holder held the lock (even with an ended
-- lease) or was the first waiter, and that no one else holds, the new first waiter (smallest
-- ticket; a row whose lease ended counts: the waiter behind it finds out by its retry_at).
--
-- for each key k (i = 0 .. n-1, n = #KEYS / 4):
-- KEYS[1 + 4i]  {prefix}:{ns}:lock:{k}      hash holder, expires_at: deleted if held by holder
-- KEYS[2 + 4i]  {prefix}:{ns}:queue:{k}     sorted set holder -> ticket: holder removed
-- KEYS[3 + 4i]  {prefix}:{ns}:waiting:{k}   hash holder -> expires_at: holder removed
-- KEYS[4 + 4i]  {prefix}:{ns}:inbox:{k}     hash holder -> pub/sub channel: holder removed; the
--                                           channel of the waiter named is where it is woken
-- (the fence counter {prefix}:{ns}:fence:{k} is not touched: tokens keep increasing)
--
-- ARGV[1]  holder
-- ARGV[2]  namespace   as the app gives it, in the message: JSON [namespace, waiter]
-- ARGV[3]  inbox       the caller's own channel: its waiters are not published to but returned
--                      (the caller wakes them without a round trip)
--
-- Returns the waiters named whose channel is the caller's.

local holder, namespace, own = ARGV[1], ARGV[2], ARGV[3]
local mine = {}
local told = {}
for i = 0, #KEYS / 4 - 1 do
  local lock, queue, waiting, inboxes = KEYS[1 + 4 * i], KEYS[2 + 4 * i], KEYS[3 + 4 * i],
    KEYS[4 + 4 * i]
  local held = redis.call('HGET', lock, 'holder')
  local first = redis.call('ZRANGE', queue, 0, 0)[1]
  if held == holder then
    redis.call('DEL', lock)
  end
  redis.call('ZREM', queue, holder)
  redis.call('HDEL', waiting, holder)
  redis.call('HDEL', inboxes, holder)
  if held == holder or (not held and first == holder) then
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if head and not told[head] then
      told[head] = true
      local inbox = redis.call('HGET', inboxes, head)
      if inbox == own then
        mine[#mine + 1] = head
      elseif inbox then
        redis.call('PUBLISH', inbox, cjson.encode({namespace, head}))
      end
    end
  end
end
return mine
