-- meter: charge debts (ms) that drain one millisecond per millisecond of the app's clock.
--
-- KEYS[i]    {prefix}:{ns}:meter:{k_i}   hash debt (ms), updated_at (s), '%.17g' strings; a key
--                                        named twice is charged twice, in order
--
-- ARGV[1]    now     seconds, the app's clock
-- ARGV[2]    keep    milliseconds of real time the key outlives its debt's draining before it
--                    may be garbage collected (a missing key is a debt of 0)
-- ARGV[2+i]  delta   ms added to key i
--
-- For each key: debt = max(0, max(0, debt - max(0, now - updated_at) * 1000) + delta), stored
-- with updated_at = max(updated_at, now) (a clock behind never un-drains a debt).
-- Returns the new debts in order, as '%.17g' strings so they read back exactly.

local now = tonumber(ARGV[1])
local keep = tonumber(ARGV[2])
local debts = {}
for i = 1, #KEYS do
  local row = redis.call('HMGET', KEYS[i], 'debt', 'updated_at')
  local debt = tonumber(row[1]) or 0
  local at = tonumber(row[2]) or now
  debt = math.max(0, math.max(0, debt - math.max(0, now - at) * 1000) + tonumber(ARGV[2 + i]))
  local text = string.format('%.17g', debt)
  redis.call('HSET', KEYS[i], 'debt', text, 'updated_at', string.format('%.17g', math.max(at, now)))
  redis.call('PEXPIRE', KEYS[i], string.format('%.0f', math.min(math.ceil(debt), 1e15) + keep))
  debts[i] = text
end
return debts
