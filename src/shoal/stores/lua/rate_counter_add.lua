-- rate_counter_add: add amounts to counters all or nothing under limits, and write the cost
-- ledger's row in the same step.
--
-- KEYS[1]      {prefix}:{ns}:ledger          list of JSON rows, oldest first (never expires)
-- KEYS[1 + i]  {prefix}:{ns}:rcount:{k_i}    hash total, updated_at ('%.17g'; never expires);
--                                            a key named twice counts twice, in order
--
-- ARGV[1]        now      seconds, the app's clock: the counters' updated_at (Redis TIME is
--                         never read)
-- ARGV[2]        row      the ledger row (JSON, encoded by the caller so its floats are exact),
--                         or '' for none
-- ARGV[1 + 2i]   amount   added to counter i (a float's repr)
-- ARGV[2 + 2i]   limit    the most counter i may hold after a positive amount, or '-' for none
--
-- Steps: before[i] = counter i as stored (0 when missing); walking i = 1..n, total = (the key's
-- running total, else before[i]) + amount; if amount > 0 and limit is given and total > limit,
-- the call is refused: nothing is written. Otherwise every counter named is stored with its last
-- total and updated_at = now, and the row (if any) is appended to the ledger.
-- Returns {1, -1, totals...} (the total after each position's amount) when added, else
-- {0, over, before...} (over: the 0-based position refused); totals are '%.17g' strings.

local n = #KEYS - 1
local now_text = string.format('%.17g', tonumber(ARGV[1]))

local function fmt(x) return string.format('%.17g', x) end

local before = {}
for i = 1, n do
  before[i] = tonumber(redis.call('HGET', KEYS[1 + i], 'total') or '') or 0
end

local running, after = {}, {}
for i = 1, n do
  local key = KEYS[1 + i]
  local amount = tonumber(ARGV[1 + 2 * i])
  local limit = ARGV[2 + 2 * i]
  local start = running[key]
  if start == nil then start = before[i] end
  local total = start + amount
  if amount > 0 and limit ~= '-' and total > tonumber(limit) then
    local answer = {0, i - 1}
    for j = 1, n do answer[#answer + 1] = fmt(before[j]) end
    return answer
  end
  running[key] = total
  after[i] = total
end

for key, total in pairs(running) do
  redis.call('HSET', key, 'total', fmt(total), 'updated_at', now_text)
end
if ARGV[2] ~= '' then redis.call('RPUSH', KEYS[1], ARGV[2]) end

local answer = {1, -1}
for i = 1, n do answer[#answer + 1] = fmt(after[i]) end
return answer
