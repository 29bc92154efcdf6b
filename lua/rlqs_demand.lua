-- Envoy RLQS (src/rls/quota/ledger.rs is its twin in Rust, and says what it is for): the ledger of
-- one divided zone and key, a hash of holders (an Envoy's stream and bucket), each
-- "demand tokens_per_fill max_tokens expires_ms reported_ms". Every Weir instance on this Redis reads and
-- writes the same ledger, so the fleet makes one division.
--
-- KEYS[1] the ledger. ARGV[1] the op, ARGV[2] now in ms ("" = Redis TIME), ARGV[3] the holder,
-- ARGV[4] how long (ms) a holder's entry lives after this call.
--   report, ARGV[5] demand, ARGV[6] stale_ms: records the holder's demand (keeping its grant) and
--     returns every live holder, this one included, as holder, demand, tokens_per_fill,
--     max_tokens, ...; a holder that has not reported for stale_ms shows demand 0 (its Envoy has
--     gone quiet: the division stops saving it a share, though its grant holds until it expires).
--   claim, ARGV[5] demand, ARGV[6..7] the wanted tokens_per_fill and max_tokens, ARGV[8..9] the
--     budget's: grants each of the two as asked but never more than the budget minus the other
--     live holders' grants, records it, returns the grant (tokens_per_fill, max_tokens).
--   leave: forgets the holder (its Envoy abandoned the bucket).
-- Expired holders are dropped on every call; the hash expires with its last holder.
local ledger = KEYS[1]
local op = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
end
local holder = ARGV[3]
local life = tonumber(ARGV[4])

if op == 'leave' then
  redis.call('HDEL', ledger, holder)
  return {}
end

local all = redis.call('HGETALL', ledger)
local live = {}
local others_rate, others_tokens = 0, 0
local mine_rate, mine_tokens = 0, 0
local last = now + life
for i = 1, #all, 2 do
  local h = all[i]
  local demand, rate, tokens, expires, reported = string.match(all[i + 1], '^(%S+) (%d+) (%d+) (%d+) (%d+)$')
  expires = tonumber(expires)
  if expires == nil or expires <= now then
    redis.call('HDEL', ledger, h)
  elseif h == holder then
    mine_rate, mine_tokens = tonumber(rate), tonumber(tokens)
  else
    others_rate = others_rate + tonumber(rate)
    others_tokens = others_tokens + tonumber(tokens)
    if expires > last then
      last = expires
    end
    live[#live + 1] = h
    if op == 'report' and now - tonumber(reported) > tonumber(ARGV[6]) then
      live[#live + 1] = '0'
    else
      live[#live + 1] = demand
    end
    live[#live + 1] = rate
    live[#live + 1] = tokens
  end
end

local demand = ARGV[5]
if op == 'report' then
  redis.call('HSET', ledger, holder, demand .. ' ' .. mine_rate .. ' ' .. mine_tokens .. ' ' .. (now + life) .. ' ' .. now)
  redis.call('PEXPIRE', ledger, last - now)
  live[#live + 1] = holder
  live[#live + 1] = demand
  live[#live + 1] = tostring(mine_rate)
  live[#live + 1] = tostring(mine_tokens)
  return live
elseif op == 'claim' then
  local rate = math.max(0, math.min(tonumber(ARGV[6]), tonumber(ARGV[8]) - others_rate))
  local tokens = math.max(0, math.min(tonumber(ARGV[7]), tonumber(ARGV[9]) - others_tokens))
  redis.call('HSET', ledger, holder, demand .. ' ' .. rate .. ' ' .. tokens .. ' ' .. (now + life) .. ' ' .. now)
  redis.call('PEXPIRE', ledger, last - now)
  return {tostring(rate), tostring(tokens)}
end
return redis.error_reply('rlqs_demand: unknown op ' .. tostring(op))
