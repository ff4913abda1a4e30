-- rate_prune_counters: delete counters last updated before a time, through the namespace's index.
--
-- KEYS[1]      {prefix}:{ns}:rcounters       zset counter key -> updated_at (see rate_counter_add)
-- KEYS[1 + i]  {prefix}:{ns}:rcount:{k_i}    the counters the caller found idle in the index
--
-- ARGV[1]      before    seconds, the app's clock: counters with updated_at < before go
-- ARGV[1 + i]  k_i       the counter key as given (its member in the index)
--
-- Each counter is checked again here (the caller read the index before this call, and a spend
-- may have touched it since): one whose index entry is still older than before is deleted with
-- its entry; one touched since, or gone, is left. Returns how many counters were deleted.

local before = tonumber(ARGV[1])
local deleted = 0
for i = 2, #KEYS do
  local member = ARGV[i]
  local updated = tonumber(redis.call('ZSCORE', KEYS[1], member) or '')
  if updated ~= nil and updated < before then
    redis.call('ZREM', KEYS[1], member)
    deleted = deleted + redis.call('DEL', KEYS[i])
  end
end
return deleted
