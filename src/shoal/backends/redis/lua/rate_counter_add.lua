-- rate_counter_add: add amounts to counters all or nothing under limits, and write the cost
-- ledger's row in the same step.
--
-- KEYS[1]      {prefix}:{ns}:ledger_rows     stream of the ledger's rows, entry id '<id>-0' with
--                                            one field 'row' (JSON); never expires
-- KEYS[2]      {prefix}:{ns}:ledger_id       string, the namespace's last ledger id (INCR);
--                                            never expires (ids are never reused)
-- KEYS[3]      {prefix}:{ns}:rcounters       zset counter key -> updated_at: the index that
--                                            prune_rates walks from the idlest; never expires
-- KEYS[3 + i]  {prefix}:{ns}:rcount:{k_i}    hash total, updated_at ('%.17g'; no expiry: pruned
--                                            through the index); a key named twice counts twice
--
-- ARGV[1]        now      seconds, the app's clock: the counters' updated_at (Redis TIME is
--                         never read)
-- ARGV[2]        row      the ledger row (JSON, encoded by the caller so its floats are exact),
--                         or '' for none
-- ARGV[3]        skip     the length of '{prefix}:{ns}:rcount:' (what KEYS[3 + i] starts with):
--                         the index holds the counter keys as given, k_i
-- ARGV[2 + 2i]   amount   added to counter i (a float's repr)
-- ARGV[3 + 2i]   limit    the most counter i may hold after a positive amount, or '-' for none
--
-- Steps: before[i] = counter i as stored (0 when missing); walking i = 1..n, total = (the key's
-- running total, else before[i]) + amount; if amount > 0 and limit is given and total > limit,
-- the call is refused: nothing is written. Otherwise the row (if any) is appended to the ledger
-- under the next id (written first: an XADD that fails leaves the counters as they were), and
-- every counter named is stored with its last total and updated_at = now, in the hash and in
-- the index.
-- Returns {1, id, totals...} (id: the row's, 0 without a row; totals: after each position's
-- amount) when added, else {0, over, before...} (over: the 0-based position refused); totals
-- are '%.17g' strings.

local n = #KEYS - 3
local now_text = string.format('%.17g', tonumber(ARGV[1]))
local skip = tonumber(ARGV[3])

local function fmt(x) return string.format('%.17g', x) end

local before = {}
for i = 1, n do
  before[i] = tonumber(redis.call('HGET', KEYS[3 + i], 'total') or '') or 0
end

local running, after = {}, {}
for i = 1, n do
  local key = KEYS[3 + i]
  local amount = tonumber(ARGV[2 + 2 * i])
  local limit = ARGV[3 + 2 * i]
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

local id = 0
if ARGV[2] ~= '' then
  id = redis.call('INCR', KEYS[2])
  redis.call('XADD', KEYS[1], string.format('%d-0', id), 'row', ARGV[2])
end
for key, total in pairs(running) do
  redis.call('HSET', key, 'total', fmt(total), 'updated_at', now_text)
  redis.call('ZADD', KEYS[3], now_text, string.sub(key, skip + 1))
end

local answer = {1, id}
for i = 1, n do answer[#answer + 1] = fmt(after[i]) end
return answer
