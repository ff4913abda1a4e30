-- heartbeat: a member's heartbeat, its roster and generation, in one atomic step.
--
-- KEYS[1]  {prefix}:{ns}:members   hash member -> 'joined_at expires_at held' ('%.17g' times,
--                                  held an integer generation or '-' for none)
-- KEYS[2]  {prefix}:{ns}:roster    hash generation -> integer, members -> JSON array of ids
--                                  (never expires: generations only increase)
-- KEYS[3]  {prefix}:{ns}:beats     hash member -> 'beat_at version' (the heartbeat's now, '%.17g';
--                                  version '=' followed by the text, or '-' for none), read by
--                                  coordination_view; kept beside the members hash so that a
--                                  member row keeps the format older code parses
--
-- ARGV[1]  member
-- ARGV[2]  held      the generation the member acts on, or '-' for none
-- ARGV[3]  now       seconds, the app's clock
-- ARGV[4]  ttl       seconds a member row lives after this heartbeat
-- ARGV[5]  warmup    seconds after joining before a member is on the roster
-- ARGV[6]  keep      milliseconds of real time before the members hash may be garbage collected
-- ARGV[7]  version   '=' followed by the member's code version, or '-' for none
--
-- Steps: delete rows with expires_at <= now; upsert member (joined_at = now when new); the
-- roster is the members with joined_at + warmup <= now, and when it differs (as a set) from the
-- stored one it is stored with generation + 1; member is granted the generation when it is on
-- the roster, held is '-' or the generation, and every other row holds '-' or the generation.
-- Returns {generation, granted (1 or 0), roster member ids...} (ids unsorted: the caller sorts).

local member, held = ARGV[1], ARGV[2]
local now, ttl, warmup = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local function fmt(x) return string.format('%.17g', x) end

local rows = redis.call('HGETALL', KEYS[1])
local live = {}
for j = 1, #rows, 2 do
  local joined, expires, h = string.match(rows[j + 1], '^(%S+) (%S+) (%S+)$')
  if not joined or tonumber(expires) <= now then
    redis.call('HDEL', KEYS[1], rows[j])
    redis.call('HDEL', KEYS[3], rows[j])
  else
    live[rows[j]] = {tonumber(joined), tonumber(expires), h}
  end
end

local row = live[member]
if row == nil then
  row = {now, now + ttl, held}
  live[member] = row
else
  row[2], row[3] = now + ttl, held
end

local roster, on = {}, {}
for name, r in pairs(live) do
  if r[1] + warmup <= now then
    roster[#roster + 1] = name
    on[name] = true
  end
end

local generation = tonumber(redis.call('HGET', KEYS[2], 'generation') or '0')
local stored = redis.call('HGET', KEYS[2], 'members')
local before = stored and cjson.decode(stored) or {}
local same = #before == #roster
if same then
  for _, name in ipairs(before) do
    if not on[name] then same = false break end
  end
end
if not same then
  generation = generation + 1
  local encoded = '[]'
  if #roster > 0 then encoded = cjson.encode(roster) end
  redis.call('HSET', KEYS[2], 'generation', string.format('%d', generation), 'members', encoded)
end

local granted = on[member] == true and (held == '-' or tonumber(held) == generation)
if granted then
  for name, r in pairs(live) do
    if name ~= member and r[3] ~= '-' and tonumber(r[3]) ~= generation then
      granted = false
      break
    end
  end
end
if granted then row[3] = string.format('%d', generation) end

redis.call('HSET', KEYS[1], member, fmt(row[1]) .. ' ' .. fmt(row[2]) .. ' ' .. row[3])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('HSET', KEYS[3], member, fmt(now) .. ' ' .. ARGV[7])
redis.call('PEXPIRE', KEYS[3], ARGV[6])

local answer = {generation, granted and 1 or 0}
for _, name in ipairs(roster) do answer[#answer + 1] = name end
return answer
