-- raise_fence: raise the fencing counters of some keys to at least a token (Redlock: the token
-- of a majority grant is the largest of the servers' tokens; every granting server must then
-- count from it, so that any later majority grant, which meets one of them, goes above it).
--
-- KEYS[i]  {prefix}:{ns}:fence:{k_i}   string, the last token granted on each key (never expires)
--
-- ARGV[1]  token     integer
--
-- Returns 1. Counters above the token are left as they are (they never go down).

local token = tonumber(ARGV[1])
for i = 1, #KEYS do
  local last = tonumber(redis.call('GET', KEYS[i]) or '0')
  if last < token then redis.call('SET', KEYS[i], string.format('%d', token)) end
end
return 1
