-- lock_acquire: grant every requested key to a holder, or queue it (FIFO by ticket).
--
-- KEYS[1]          {prefix}:{ns}:tickets        string, the namespace's last ticket (never expires)
-- then, for each requested key k (i = 0 .. n-1, n = (#KEYS - 1) / 5):
-- KEYS[2 + 5i]     {prefix}:{ns}:lock:{k}       hash holder, expires_at: the hold of k
-- KEYS[3 + 5i]     {prefix}:{ns}:queue:{k}      sorted set holder -> ticket: the waiters of k
-- KEYS[4 + 5i]     {prefix}:{ns}:waiting:{k}    hash holder -> expires_at: each waiter's lease
-- KEYS[5 + 5i]     {prefix}:{ns}:fence:{k}      string, the last token granted on k (never expires)
-- KEYS[6 + 5i]     {prefix}:{ns}:inbox:{k}      hash holder -> the pub/sub channel of the store
--                                               object that waits for it (lock_release wakes it)
--
-- ARGV[1]  holder    unique per acquisition
-- ARGV[2]  lease     seconds
-- ARGV[3]  now       seconds, the app's clock (Redis TIME is never read)
-- ARGV[4]  keep      milliseconds of real time after which the rows written here may be
--                    garbage collected (cleanup only, far longer than any lease)
-- ARGV[5]  inbox     the caller's pub/sub channel, recorded while it waits
--
-- Returns {1, token, expires_at} when every key is granted (token = max(fence) + 1, stored in
-- every fence; the holder's waiter rows are deleted), else {0, ticket, retry_at}: the holder is
-- queued on every key with its ticket (a new one, larger than any given before in the namespace,
-- if it was not queued) and its waiter rows last until now + lease; retry_at is the earliest,
-- among these keys, of the lease end of the live hold and of the live waiter right ahead of the
-- holder, if any (now + lease only if there is neither: like the memory reference, it may lie
-- beyond the caller's own waiter lease).
-- Times are returned as '%.17g' strings so they read back exactly.

local holder = ARGV[1]
local lease = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local keep = ARGV[4]
local inbox = ARGV[5]
local n = (#KEYS - 1) / 5

local function fmt(x) return string.format('%.17g', x) end

-- waiters whose lease ended leave every queue they were in
for i = 0, n - 1 do
  local queue, waiting, inboxes = KEYS[3 + 5 * i], KEYS[4 + 5 * i], KEYS[6 + 5 * i]
  local names = redis.call('ZRANGE', queue, 0, -1)
  for j = 1, #names do
    local ends = redis.call('HGET', waiting, names[j])
    if not ends or tonumber(ends) <= now then
      redis.call('ZREM', queue, names[j])
      redis.call('HDEL', waiting, names[j])
      redis.call('HDEL', inboxes, names[j])
    end
  end
end

local mine = redis.call('ZSCORE', KEYS[3], holder)
local ticket = mine and tonumber(mine) or nil

local free, first = true, true
for i = 0, n - 1 do
  local hold = redis.call('HMGET', KEYS[2 + 5 * i], 'holder', 'expires_at')
  if hold[1] and tonumber(hold[2]) > now then free = false end
  local head = redis.call('ZRANGE', KEYS[3 + 5 * i], 0, 0, 'WITHSCORES')
  if #head > 0 and tonumber(head[2]) ~= ticket then first = false end
end

if free and first then
  local token = 0
  for i = 0, n - 1 do
    local last = tonumber(redis.call('GET', KEYS[5 + 5 * i]) or '0')
    if last > token then token = last end
  end
  token = token + 1
  local expires_at = fmt(now + lease)
  for i = 0, n - 1 do
    redis.call('SET', KEYS[5 + 5 * i], string.format('%d', token))
    redis.call('HSET', KEYS[2 + 5 * i], 'holder', holder, 'expires_at', expires_at)
    redis.call('PEXPIRE', KEYS[2 + 5 * i], keep)
    redis.call('ZREM', KEYS[3 + 5 * i], holder)
    redis.call('HDEL', KEYS[4 + 5 * i], holder)
    redis.call('HDEL', KEYS[6 + 5 * i], holder)
  end
  return {1, token, expires_at}
end

if ticket == nil then ticket = redis.call('INCR', KEYS[1]) end
local until_ = fmt(now + lease)
local score = string.format('%d', ticket)
local retry_at = nil
for i = 0, n - 1 do
  local lock, queue, waiting, inboxes = KEYS[2 + 5 * i], KEYS[3 + 5 * i], KEYS[4 + 5 * i],
    KEYS[6 + 5 * i]
  redis.call('ZADD', queue, score, holder)
  redis.call('HSET', waiting, holder, until_)
  redis.call('HSET', inboxes, holder, inbox)
  redis.call('PEXPIRE', queue, keep)
  redis.call('PEXPIRE', waiting, keep)
  redis.call('PEXPIRE', inboxes, keep)
  -- when to ask again by itself here: the live hold's end and the end of the waiter right
  -- ahead, whichever comes first (a dead hold is noticed even if the waiters ahead give up)
  local ahead = redis.call('ZREVRANGEBYSCORE', queue, '(' .. score, '-inf', 'LIMIT', 0, 1)
  if #ahead > 0 then
    local ends = tonumber(redis.call('HGET', waiting, ahead[1]))
    if ends and (retry_at == nil or ends < retry_at) then retry_at = ends end
  end
  local hold = redis.call('HMGET', lock, 'holder', 'expires_at')
  if hold[1] and tonumber(hold[2]) > now then
    local ends = tonumber(hold[2])
    if retry_at == nil or ends < retry_at then retry_at = ends end
  end
end
return {0, ticket, fmt(retry_at or now + lease)}
