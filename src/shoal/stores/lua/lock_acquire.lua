-- lock_acquire: grant every requested key to a holder, or queue it (FIFO by ticket).
--
-- KEYS[1]          {prefix}:{ns}:tickets        string, the namespace's last ticket (never expires)
-- then, for each requested key k (i = 0 .. n-1, n = (#KEYS - 1) / 4):
-- KEYS[2 + 4i]     {prefix}:{ns}:lock:{k}       hash holder, expires_at: the hold of k
-- KEYS[3 + 4i]     {prefix}:{ns}:queue:{k}      sorted set holder -> ticket: the waiters of k
-- KEYS[4 + 4i]     {prefix}:{ns}:waiting:{k}    hash holder -> expires_at: each waiter's lease
-- KEYS[5 + 4i]     {prefix}:{ns}:fence:{k}      string, the last token granted on k (never expires)
--
-- ARGV[1]  holder    unique per acquisition
-- ARGV[2]  lease     seconds
-- ARGV[3]  now       seconds, the app's clock (Redis TIME is never read)
-- ARGV[4]  keep      milliseconds of real time after which the rows written here may be
--                    garbage collected (cleanup only, far longer than any lease)
--
-- Returns {1, token, expires_at} when every key is granted (token = max(fence) + 1, stored in
-- every fence; the holder's waiter rows are deleted), else {0, ticket, retry_at}: the holder is
-- queued on every key with its ticket (a new one, larger than any given before in the namespace,
-- if it was not queued) and its waiter rows last until now + lease; retry_at is the earliest end
-- of a live hold or of an earlier waiter's lease on these keys (now + lease only if there is
-- none: like the memory reference, it may lie beyond the caller's own waiter lease).
-- Times are returned as '%.17g' strings so they read back exactly.

local holder = ARGV[1]
local lease = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local keep = ARGV[4]
local n = (#KEYS - 1) / 4

local function fmt(x) return string.format('%.17g', x) end

-- waiters whose lease ended leave every queue they were in
for i = 0, n - 1 do
  local queue, waiting = KEYS[3 + 4 * i], KEYS[4 + 4 * i]
  local names = redis.call('ZRANGE', queue, 0, -1)
  for j = 1, #names do
    local ends = redis.call('HGET', waiting, names[j])
    if not ends or tonumber(ends) <= now then
      redis.call('ZREM', queue, names[j])
      redis.call('HDEL', waiting, names[j])
    end
  end
end

local mine = redis.call('ZSCORE', KEYS[3], holder)
local ticket = mine and tonumber(mine) or nil

local free, first = true, true
for i = 0, n - 1 do
  local hold = redis.call('HMGET', KEYS[2 + 4 * i], 'holder', 'expires_at')
  if hold[1] and tonumber(hold[2]) > now then free = false end
  local head = redis.call('ZRANGE', KEYS[3 + 4 * i], 0, 0, 'WITHSCORES')
  if #head > 0 and tonumber(head[2]) ~= ticket then first = false end
end

if free and first then
  local token = 0
  for i = 0, n - 1 do
    local last = tonumber(redis.call('GET', KEYS[5 + 4 * i]) or '0')
    if last > token then token = last end
  end
  token = token + 1
  local expires_at = fmt(now + lease)
  for i = 0, n - 1 do
    redis.call('SET', KEYS[5 + 4 * i], string.format('%d', token))
    redis.call('HSET', KEYS[2 + 4 * i], 'holder', holder, 'expires_at', expires_at)
    redis.call('PEXPIRE', KEYS[2 + 4 * i], keep)
    redis.call('ZREM', KEYS[3 + 4 * i], holder)
    redis.call('HDEL', KEYS[4 + 4 * i], holder)
  end
  return {1, token, expires_at}
end

if ticket == nil then ticket = redis.call('INCR', KEYS[1]) end
local until_ = fmt(now + lease)
local retry_at = nil
for i = 0, n - 1 do
  local lock, queue, waiting = KEYS[2 + 4 * i], KEYS[3 + 4 * i], KEYS[4 + 4 * i]
  redis.call('ZADD', queue, string.format('%d', ticket), holder)
  redis.call('HSET', waiting, holder, until_)
  redis.call('PEXPIRE', queue, keep)
  redis.call('PEXPIRE', waiting, keep)
  local hold = redis.call('HMGET', lock, 'holder', 'expires_at')
  if hold[1] then
    local ends = tonumber(hold[2])
    if ends > now and (retry_at == nil or ends < retry_at) then retry_at = ends end
  end
  local ahead = redis.call('ZRANGEBYSCORE', queue, '-inf', '(' .. string.format('%d', ticket))
  for j = 1, #ahead do
    local e = tonumber(redis.call('HGET', waiting, ahead[j]))
    if retry_at == nil or e < retry_at then retry_at = e end
  end
end
return {0, ticket, fmt(retry_at or now + lease)}
