-- rate_window_add: a sliding window's total over the last 'window' seconds, added to under a limit.
--
-- KEYS[1]  {prefix}:{ns}:rwz:{key}   sorted set of entries: score = at (seconds, the app's
--                                    clock), member = '<seq> <amount>' (seq: this window's
--                                    counter, 16 zero-padded digits, so entries of the same at
--                                    sort in the order they were added and never collide;
--                                    amount: '%.17g'); cleanup expiry only, never shortened
-- KEYS[2]  {prefix}:{ns}:rwt:{key}   hash: total (the running total of the entries, '%.17g'),
--                                    seq (the last seq given); deleted when the window empties;
--                                    cleanup expiry as KEYS[1]
--
-- ARGV[1]  amount    a float's repr ('1.0', '0.5', '-0.4')
-- ARGV[2]  window    seconds
-- ARGV[3]  limit     the most the window may hold, or '-' for none
-- ARGV[4]  now       seconds, the app's clock (Redis TIME is never read); may be earlier than
--                    other entries' at (a correction dated when its estimate was counted)
-- ARGV[5]  keep      milliseconds of real time both keys outlive this write before they may be
--                    garbage collected (at least 2 x window and an hour)
--
-- Steps (the memory reference's, shoal.backends.memory.rates): the entries with at <= now - window
-- leave, oldest first (a range by score, read and removed in chunks), and their amounts are
-- subtracted from the running total; an empty window has a total of exactly 0 (its total hash is
-- deleted). If amount > 0, limit is given and total + amount > limit: refused, nothing added, and
-- retry_at = at + window of the first entry, walking from the oldest (by at, then as added), whose
-- leaving (with every entry before it) makes room; the walk reads chunks from the oldest and
-- stops there (no retry_at when amount > limit). Otherwise the entry (now, amount) is added and
-- the total grows by amount (nothing added for 0: a read; a negative amount is never refused).
-- Cost: O(log n) plus the entries leaving (plus those walked when refused), never the window.
-- Returns {1, new total, ''} when added, {0, total, retry_at or ''} when refused; numbers are
-- '%.17g' strings so they read back exactly.
--
-- Data of the layout before (a list under {prefix}:{ns}:rwin:{key}) is not read: such a window
-- counts as empty, and the old list goes with its cleanup expiry.
--
-- If the total hash is missing while entries remain (evicted under memory pressure), the total
-- is summed once afresh from the entries.

local window = tonumber(ARGV[2])
local limit = nil
if ARGV[3] ~= '-' then limit = tonumber(ARGV[3]) end
local now = tonumber(ARGV[4])
local amount = tonumber(ARGV[1])
local CHUNK = 1000

local function fmt(x) return string.format('%.17g', x) end
local function amount_of(member) return tonumber(string.match(member, ' (%S+)$')) end

local function seq_of(member) return tonumber(string.match(member, '^(%d+) ')) end

local total = tonumber(redis.call('HGET', KEYS[2], 'total'))
local seq = tonumber(redis.call('HGET', KEYS[2], 'seq'))
local dirty = false                                      -- the total hash needs writing
if total == nil or seq == nil then
  -- no total: a new window, or a total lost while entries stayed; sum the entries once
  total, seq = 0, 0
  local start = 0
  while true do
    local rows = redis.call('ZRANGE', KEYS[1], start, start + CHUNK - 1)
    for j = 1, #rows do
      total = total + amount_of(rows[j])
      seq = math.max(seq, seq_of(rows[j]))
    end
    if #rows < CHUNK then break end
    start = start + CHUNK
  end
  dirty = true
end

-- the entries leaving: at <= now - window, oldest first
local cutoff = fmt(now - window)
while true do
  local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff, 'LIMIT', 0, CHUNK)
  if #rows == 0 then break end
  for j = 1, #rows do total = total - amount_of(rows[j]) end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #rows - 1)   -- exactly those: the lowest ranks
  dirty = true
  if #rows < CHUNK then break end
end

local empty = redis.call('EXISTS', KEYS[1]) == 0
if empty then
  total, seq = 0, 0                                      -- no drift survives an empty window
end

local refused = amount > 0 and limit ~= nil and total + amount > limit
local retry_at = ''
if refused and amount <= limit then
  local left, start, size = total, 0, 16
  while retry_at == '' do
    local rows = redis.call('ZRANGE', KEYS[1], start, start + size - 1, 'WITHSCORES')
    for j = 1, #rows, 2 do
      left = left - amount_of(rows[j])
      if left + amount <= limit then
        retry_at = fmt(tonumber(rows[j + 1]) + window)
        break
      end
    end
    if #rows < 2 * size then break end
    start = start + size
    size = math.min(size * 4, CHUNK)
  end
elseif not refused and amount ~= 0 then
  seq = seq + 1
  redis.call('ZADD', KEYS[1], fmt(now), string.format('%016d', seq) .. ' ' .. fmt(amount))
  total = total + amount
  empty, dirty = false, true
end

if empty then
  redis.call('DEL', KEYS[2])
elseif dirty then
  redis.call('HSET', KEYS[2], 'total', fmt(total), 'seq', string.format('%d', seq))
  local keep = tonumber(ARGV[5])
  for k = 1, 2 do
    if redis.call('PTTL', KEYS[k]) < keep then redis.call('PEXPIRE', KEYS[k], keep) end
  end
end
if refused then return {0, fmt(total), retry_at} end
return {1, fmt(total), ''}
