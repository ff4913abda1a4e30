-- rate_slot_acquire: take (or take again) one of a key's slots, at most max_slots live holders.
--
-- KEYS[1]  {prefix}:{ns}:rslots:{key}   hash holder -> expires_at ('%.17g' seconds, the app's
--                                       clock); cleanup expiry only, never shortened
--
-- ARGV[1]  holder
-- ARGV[2]  max_slots  integer
-- ARGV[3]  lease      seconds
-- ARGV[4]  now        seconds, the app's clock (Redis TIME is never read)
-- ARGV[5]  keep       milliseconds of real time the hash outlives this write before it may be
--                     garbage collected (at least 10 x lease and an hour)
--
-- Steps: delete the rows with expires_at <= now; if holder has a live row, or fewer than
-- max_slots rows are live, holder's row is set to now + lease; else nothing is written.
-- Returns {1, expires_at} when granted, {0, retry_at} when busy (retry_at: the earliest
-- expires_at of the live rows), or {0, ''} when busy with no live row (max_slots < 1).
-- Times are '%.17g' strings so they read back exactly.

local holder = ARGV[1]
local max_slots = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local keep = tonumber(ARGV[5])

local function fmt(x) return string.format('%.17g', x) end

local rows = redis.call('HGETALL', KEYS[1])
local live, mine, first = 0, false, nil
for j = 1, #rows, 2 do
  local ends = tonumber(rows[j + 1])
  if ends == nil or ends <= now then
    redis.call('HDEL', KEYS[1], rows[j])
  else
    live = live + 1
    if rows[j] == holder then mine = true end
    if first == nil or ends < first then first = ends end
  end
end

if mine or live < max_slots then
  local expires_at = fmt(now + lease)
  redis.call('HSET', KEYS[1], holder, expires_at)
  if redis.call('PTTL', KEYS[1]) < keep then
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
  end
  return {1, expires_at}
end
if first == nil then return {0, ''} end
return {0, fmt(first)}
