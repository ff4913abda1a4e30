-- rate_window_add: a sliding window's sum over the last 'window' seconds, added to under a limit.
--
-- KEYS[1]  {prefix}:{ns}:rwin:{key}   list of entries 'at amount', in the order they were added
--                                     (at: '%.17g' seconds, the app's clock; amount: the text
--                                     the caller gave, an integer or a float's repr); cleanup
--                                     expiry only, never shortened
--
-- ARGV[1]  amount    an integer ('1') or a float's repr ('0.5'); its integer-ness is kept (see
--                    ARGV[6])
-- ARGV[2]  window    seconds
-- ARGV[3]  limit     the most the window may hold, or '-' for none
-- ARGV[4]  now       seconds, the app's clock (Redis TIME is never read)
-- ARGV[5]  keep      milliseconds of real time the list outlives this write before it may be
--                    garbage collected (at least 2 x window and an hour)
-- ARGV[6]  sum       '1': total as Python >= 3.12's sum() (integers exactly while only integers
--                    came, then Neumaier-compensated floats, integers after a float added plainly);
--                    '0': as Python 3.11's (left to right); so the total is the memory
--                    reference's to the last bit
--
-- Steps: forget entries with at <= now - window (an LTRIM when they are the oldest, as when the
-- clock only goes forward, else the list is rewritten in order); total = the sum of the others in
-- the order they were added. If amount > 0, limit is given and total + amount > limit: refused,
-- nothing added, and retry_at = at + window of the first entry, in (at, amount) order, whose
-- leaving (with every entry before it) makes room (none when amount > limit). Otherwise the
-- entry (now, amount) is appended (none for 0: a read; a negative amount is never refused).
-- Returns {1, total + amount, ''} when added, {0, total, retry_at or ''} when refused; numbers are
-- '%.17g' strings so they read back exactly.

local amount_text = ARGV[1]
local amount = tonumber(amount_text)
local window = tonumber(ARGV[2])
local limit = nil
if ARGV[3] ~= '-' then limit = tonumber(ARGV[3]) end
local now = tonumber(ARGV[4])
local compensated = ARGV[6] == '1'

local function fmt(x) return string.format('%.17g', x) end

local rows = redis.call('LRANGE', KEYS[1], 0, -1)
local cutoff = now - window
local kept = {}                 -- {at, amount, integer?, row}
local gone, last_gone = 0, 0
for j = 1, #rows do
  local at_text, a_text = string.match(rows[j], '^(%S+) (%S+)$')
  local at, a = tonumber(at_text), tonumber(a_text)
  if at ~= nil and a ~= nil and at > cutoff then
    kept[#kept + 1] = {at, a, string.find(a_text, '^%-?%d+$') ~= nil, rows[j]}
  else
    gone, last_gone = gone + 1, j
  end
end
if gone > 0 then
  if last_gone == gone then
    redis.call('LTRIM', KEYS[1], gone, -1)        -- the oldest left; the expiry stays
  else
    local ttl = redis.call('PTTL', KEYS[1])
    redis.call('DEL', KEYS[1])
    for j = 1, #kept, 1000 do
      local chunk = {}
      for m = j, math.min(j + 999, #kept) do chunk[#chunk + 1] = kept[m][4] end
      redis.call('RPUSH', KEYS[1], unpack(chunk))
    end
    if #kept > 0 and ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
  end
end

-- the total, summed exactly like the reference's sum() over the same entries in the same order
local total
if compensated then
  local k, exact = 1, 0
  while k <= #kept and kept[k][3] do
    exact = exact + kept[k][2]
    k = k + 1
  end
  if k > #kept then
    total = exact
  else
    local f, c = exact + kept[k][2], 0
    for m = k + 1, #kept do
      local x = kept[m][2]
      if kept[m][3] then
        f = f + x
      else
        local t = f + x
        if math.abs(f) >= math.abs(x) then c = c + ((f - t) + x) else c = c + ((x - t) + f) end
        f = t
      end
    end
    if c ~= 0 and c == c and c ~= math.huge and c ~= -math.huge then f = f + c end
    total = f
  end
else
  total = 0
  for m = 1, #kept do total = total + kept[m][2] end
end

if amount > 0 and limit ~= nil and total + amount > limit then
  local retry_at = ''
  if amount <= limit then
    table.sort(kept, function(x, y) return x[1] < y[1] or (x[1] == y[1] and x[2] < y[2]) end)
    local left = total
    for m = 1, #kept do
      left = left - kept[m][2]
      if left + amount <= limit then
        retry_at = fmt(kept[m][1] + window)
        break
      end
    end
  end
  return {0, fmt(total), retry_at}
end

if amount ~= 0 then
  redis.call('RPUSH', KEYS[1], fmt(now) .. ' ' .. amount_text)
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[5]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
  end
end
return {1, fmt(total + amount), ''}
