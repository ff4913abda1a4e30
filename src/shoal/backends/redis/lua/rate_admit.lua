-- rate_admit: a call's admission, all or nothing: slots, pauses that must not be in force, room
-- in windows, and a breaker's circuit, each looked at in order; the first need that cannot be
-- met refuses the call and nothing is taken; otherwise every slot is taken and every window
-- amount counted at now (shoal.ports.RateStore.admit; the memory reference is
-- shoal.backends.memory.rates).
--
-- KEYS, need after need, in the order of the request (each need's keys as its own script keeps
-- them, with the same cleanup expiries):
--
--   a slot:     {prefix}:{ns}:rslots:{key}      hash holder -> expires_at (rate_slot_acquire)
--   a pause:    {prefix}:{ns}:rpause:{key}      string, the end of the pause (rate_pause_until,
--                                               rate_paused_until)
--   a window:   {prefix}:{ns}:rwz:{key}         sorted set of entries (rate_window_add)
--               {prefix}:{ns}:rwt:{key}         hash total, seq (rate_window_add)
--   a circuit:  {prefix}:{ns}:rpause:{open}     its cooldown, a pause
--               {prefix}:{ns}:rcount:{opened}   counter hashes total, updated_at
--               {prefix}:{ns}:rcount:{closed}   (rate_counter_add): read, as it reads them
--               {prefix}:{ns}:rslots:{trial}    its trial slot, of one place
--               {prefix}:{ns}:rcounters         zset counter key -> updated_at, the index
--                                               prune_rates walks (rate_counter_add)
--
-- ARGV[1]  holder
-- ARGV[2]  now       seconds, the app's clock (Redis TIME is never read)
-- ARGV[3]  pkeep     milliseconds of real time a pause found ended is kept before it may be
--                    garbage collected (as rate_paused_until's keep)
-- then, need after need, its kind and its arguments:
--   'slot',    max_slots, lease (seconds), keep (ms, as rate_slot_acquire's)
--   'pause'
--   'window',  amount (> 0), window (seconds), limit or '-', keep (ms, as rate_window_add's)
--   'circuit', lease (seconds) and keep (ms) of the trial slot, then the opened and the closed
--              counter keys as given (their members in the index)
--
-- Steps, for each need in order (what each step forgets or writes before a refusal is what its
-- own script would also write: ended slots and window entries that left, a window's total, a
-- cleanup expiry, a counter's updated_at; never a slot taken or an amount counted):
--   slot:    delete the rows with expires_at <= now; refused (retry_at: the first live row's
--            end) unless holder has a live row or fewer than max_slots are live;
--   pause:   refused (retry_at: its end) if the stored end is after now; else an ended pause
--            gets its cleanup expiry, as rate_paused_until gives it;
--   window:  the entries with at <= now - window leave (their amounts subtracted from the total,
--            exactly 0 once empty; a lost total summed again from the entries); refused if limit
--            is given and total + amount > limit, with retry_at as rate_window_add walks it (''
--            when amount > limit);
--   circuit: refused (retry_at: the end of its cooldown) if its pause is in force; else its
--            counters are read as rate_counter_add reads them (a counter never counted is 0;
--            each stored again with updated_at now, in the hash and in the index), and if
--            opened > closed, refused
--            (retry_at '') unless the trial slot is free or holder's, as a slot of max_slots 1.
-- All met: each slot (and the trial slot, if the circuit was tripped) is set to now + lease;
-- each window gets the entry (now, amount) and its total grows by amount.
-- Returns {1, trial} when admitted (trial: the opened counter when the trial slot was taken,
-- else ''), {0, part, retry_at or ''} when refused (part: the 0-based position of the need).
-- Times and counts are '%.17g' strings so they read back exactly.

local holder = ARGV[1]
local now = tonumber(ARGV[2])
local CHUNK = 1000

local function fmt(x) return string.format('%.17g', x) end
local function amount_of(member) return tonumber(string.match(member, ' (%S+)$')) end
local function seq_of(member) return tonumber(string.match(member, '^(%d+) ')) end

local function expire_at_least(key, keep)
  if redis.call('PTTL', key) < keep then redis.call('PEXPIRE', key, keep) end
end

-- nil if holder may take one of the slots of key (ended rows deleted), else the first end
local function slot_busy(key, max_slots)
  local rows = redis.call('HGETALL', key)
  local live, mine, first = 0, false, nil
  for j = 1, #rows, 2 do
    local ends = tonumber(rows[j + 1])
    if ends == nil or ends <= now then
      redis.call('HDEL', key, rows[j])
    else
      live = live + 1
      if rows[j] == holder then mine = true end
      if first == nil or ends < first then first = ends end
    end
  end
  if mine or live < max_slots then return nil end
  if first == nil then return '' end   -- max_slots < 1, nothing held: the caller raises
  return fmt(first)
end

-- the end of the pause of key if after now, else nil (an ended pause gets its cleanup expiry)
local function paused(key)
  local stored = redis.call('GET', key)
  if not stored then return nil end
  local until_ = tonumber(stored)
  if until_ ~= nil and until_ > now then return until_ end
  if redis.call('PTTL', key) == -1 then redis.call('PEXPIRE', key, ARGV[3]) end
  return nil
end

-- the window's entries that left forgotten: {total, seq, empty}, the total hash written back
local function window_state(zkey, tkey, window, keep)
  local total = tonumber(redis.call('HGET', tkey, 'total'))
  local seq = tonumber(redis.call('HGET', tkey, 'seq'))
  local dirty = false
  if total == nil or seq == nil then
    total, seq = 0, 0
    local start = 0
    while true do
      local rows = redis.call('ZRANGE', zkey, start, start + CHUNK - 1)
      for j = 1, #rows do
        total = total + amount_of(rows[j])
        seq = math.max(seq, seq_of(rows[j]))
      end
      if #rows < CHUNK then break end
      start = start + CHUNK
    end
    dirty = true
  end
  local cutoff = fmt(now - window)
  while true do
    local rows = redis.call('ZRANGEBYSCORE', zkey, '-inf', cutoff, 'LIMIT', 0, CHUNK)
    if #rows == 0 then break end
    for j = 1, #rows do total = total - amount_of(rows[j]) end
    redis.call('ZREMRANGEBYRANK', zkey, 0, #rows - 1)
    dirty = true
    if #rows < CHUNK then break end
  end
  local empty = redis.call('EXISTS', zkey) == 0
  if empty then
    total, seq = 0, 0
    redis.call('DEL', tkey)
  elseif dirty then
    redis.call('HSET', tkey, 'total', fmt(total), 'seq', string.format('%d', seq))
    expire_at_least(zkey, keep)
    expire_at_least(tkey, keep)
  end
  return {total = total, seq = seq}
end

-- when amount (<= limit) fits: the at + window of the entry whose leaving, with those before it,
-- makes room; '' if none does
local function fits_at(zkey, total, amount, window, limit)
  local left, start, size = total, 0, 16
  while true do
    local rows = redis.call('ZRANGE', zkey, start, start + size - 1, 'WITHSCORES')
    for j = 1, #rows, 2 do
      left = left - amount_of(rows[j])
      if left + amount <= limit then return fmt(tonumber(rows[j + 1]) + window) end
    end
    if #rows < 2 * size then return '' end
    start = start + size
    size = math.min(size * 4, CHUNK)
  end
end

-- look at each need, in order
local needs, k, a, trial = {}, 1, 4, nil
local part = 0
while a <= #ARGV do
  local kind = ARGV[a]
  if kind == 'slot' then
    local need = {kind = kind, key = KEYS[k], lease = tonumber(ARGV[a + 2]),
                  keep = tonumber(ARGV[a + 3])}
    local busy = slot_busy(need.key, tonumber(ARGV[a + 1]))
    if busy ~= nil then return {0, part, busy} end
    needs[#needs + 1] = need
    k, a = k + 1, a + 4
  elseif kind == 'pause' then
    local until_ = paused(KEYS[k])
    if until_ ~= nil then return {0, part, fmt(until_)} end
    k, a = k + 1, a + 1
  elseif kind == 'window' then
    local amount, window = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local limit = nil
    if ARGV[a + 3] ~= '-' then limit = tonumber(ARGV[a + 3]) end
    local keep = tonumber(ARGV[a + 4])
    local state = window_state(KEYS[k], KEYS[k + 1], window, keep)
    if limit ~= nil and state.total + amount > limit then
      local retry_at = ''
      if amount <= limit then retry_at = fits_at(KEYS[k], state.total, amount, window, limit) end
      return {0, part, retry_at}
    end
    needs[#needs + 1] = {kind = kind, zkey = KEYS[k], tkey = KEYS[k + 1], amount = amount,
                         keep = keep, total = state.total, seq = state.seq}
    k, a = k + 2, a + 5
  elseif kind == 'circuit' then
    local until_ = paused(KEYS[k])
    if until_ ~= nil then return {0, part, fmt(until_)} end
    local opened = tonumber(redis.call('HGET', KEYS[k + 1], 'total') or '') or 0
    local closed = tonumber(redis.call('HGET', KEYS[k + 2], 'total') or '') or 0
    -- read as rate_counter_add reads them: stored again, updated_at now
    redis.call('HSET', KEYS[k + 1], 'total', fmt(opened), 'updated_at', fmt(now))
    redis.call('HSET', KEYS[k + 2], 'total', fmt(closed), 'updated_at', fmt(now))
    redis.call('ZADD', KEYS[k + 4], fmt(now), ARGV[a + 3])
    redis.call('ZADD', KEYS[k + 4], fmt(now), ARGV[a + 4])
    if opened > closed then
      if slot_busy(KEYS[k + 3], 1) ~= nil then return {0, part, ''} end
      trial = opened
      needs[#needs + 1] = {kind = 'slot', key = KEYS[k + 3], lease = tonumber(ARGV[a + 1]),
                           keep = tonumber(ARGV[a + 2])}
    end
    k, a = k + 5, a + 5
  else
    return redis.error_reply('rate_admit: unknown need ' .. tostring(kind))
  end
  part = part + 1
end

-- all met: take them
for _, need in ipairs(needs) do
  if need.kind == 'slot' then
    redis.call('HSET', need.key, holder, fmt(now + need.lease))
    expire_at_least(need.key, need.keep)
  else
    local seq = need.seq + 1
    redis.call('ZADD', need.zkey, fmt(now), string.format('%016d', seq) .. ' ' .. fmt(need.amount))
    redis.call('HSET', need.tkey, 'total', fmt(need.total + need.amount),
               'seq', string.format('%d', seq))
    expire_at_least(need.zkey, need.keep)
    expire_at_least(need.tkey, need.keep)
  end
end
if trial == nil then return {1, ''} end
return {1, fmt(trial)}
