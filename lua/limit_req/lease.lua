-- lua/limit_req/lease.lua: leases of a key's budget (docs/leases.md), src/limit/lease/mod.rs's
-- `grant` and `give_back` in Lua, expression for expression (tests/lease_differential.rs).
-- A grant is a debit of the key's own state made with the algorithm's own `evaluate` as one
-- request of cost g, so a leased key holds exactly the state an exact zone keeps (same key, same
-- format, same TTL); a give-back credits unused tokens (the bucket as if the lease had been that
-- much smaller). Only the bucket family and fixed windows lease (`lease::leasable`).
--
-- KEYS[1]  the key's state (store::redis_key), KEYS[2] its live lease holders: a hash of holder
--          id -> the lease's end, µs on this clock (KEYS[1] .. ":lease": the same hash slot).
-- ARGV[1]  "lease"   ARGV[2] "grant" | "give" | "grants" (several keys' grants in one call)
-- ARGV[3]  the holder's id: "i" and digits (never "0", so the leaky bucket's fast paths, which
--          look at ARGV[3], pass the call on)
-- ARGV[4]  now, µs ("" = Redis TIME)
-- ARGV[5..10] the zone's six values, as in the decision layout (prelude.lua); its cost is the
--          least grant the instance takes (grant) or the unused tokens it gives back (give)
-- grant:   ARGV[11] tokens wanted, ARGV[12] lifetime_us. Reply: tokens granted (0: refused),
--          retry_us (when the least grant fits again: refused, or granted and the key left
--          unable to cover it; -1 never, or it can),
--          window_start_us and window_left_us (fixed windows; -1 otherwise), now_us.
-- give:    ARGV[11] window_start_us of the lease ("" none). Reply: { 1 }.

local LEASED = { [LEAKY] = leaky_bucket, [TOKEN] = token_bucket, [FIXED] = fixed_window }

-- The zone's parameters with another cost (parameters are only read elsewhere: copied).
local function with_cost(p, cost)
  local q = {}
  for k, v in pairs(p) do
    q[k] = v
  end
  q.cost = cost
  return q
end

-- dispatch.lua's `persist` for one string key.
local function lease_store(key, z)
  local ttl_ms = int(math.ceil((z.expires_us - now) / 1000) + 1)
  redis.call('SET', key, z.value, 'PX', ttl_ms)
end

-- Live holders other than `holder` (ended ones are dropped), and the latest end among them.
local function live_holders(hkey, holder)
  local all = redis.call('HGETALL', hkey)
  local others, latest = 0, 0
  for i = 1, #all, 2 do
    local id, ends = all[i], tonumber(all[i + 1])
    if not ends or ends <= now then
      redis.call('HDEL', hkey, id)
    elseif id ~= holder then
      others = others + 1
      if ends > latest then
        latest = ends
      end
    end
  end
  return others, latest
end

-- lease::grant: min(want, room, max(min, room / holders)), holders counting the asker.
local function lease_grant(key, hkey, holder, p, want, lifetime_us)
  local least = p.cost
  if want < least then
    want = least
  end
  -- The least grant as a request: what a refusal, and a grant that empties the key, say fits when.
  local first = least
  if first < 1 then
    first = 1
  end
  local others, latest = live_holders(hkey, holder)
  local probe = p.evaluate(key, with_cost(p, 1))
  local room = 0
  if probe.admitted then
    room = probe.remaining + 1
  end
  local share = math.floor(room / (others + 1))
  if share < least then
    share = least
  end
  local tokens = want
  if room < tokens then
    tokens = room
  end
  if share < tokens then
    tokens = share
  end
  local window_start, window_left = -1, -1
  if p.algorithm == FIXED then
    window_start = now - now % p.period_us
    window_left = p.period_us - now % p.period_us
  end
  if tokens < least or tokens == 0 then
    local refused = p.evaluate(key, with_cost(p, first))
    -- As the model: a refused asker is no longer counted as a holder (its renewal failed).
    redis.call('HDEL', hkey, holder)
    return { 0, refused.retry_us, window_start, window_left, now }
  end
  lease_store(key, p.evaluate(key, with_cost(p, tokens)))
  -- As the model: a grant that leaves the key unable to cover the least grant says when it can.
  -- Room left for the least grant needs no evaluation (room is a floor of what fits).
  local retry_us = -1
  if room - tokens < first then
    local after = p.evaluate(key, with_cost(p, first))
    if not after.admitted then
      retry_us = after.retry_us
    end
  end
  local life = lifetime_us
  if window_left >= 0 and window_left < life then
    life = window_left
  end
  local ends = now + life
  redis.call('HSET', hkey, holder, int(ends))
  if ends > latest then
    latest = ends
  end
  redis.call('PEXPIRE', hkey, int(math.ceil((latest - now) / 1000) + 1))
  return { tokens, retry_us, window_start, window_left, now }
end

-- lease::give_back: the state drained (or refilled) to now by a request of cost 0, then credited;
-- a window's tokens only to their own window while it lasts. Another algorithm's state, or none,
-- is left alone.
local function lease_give(key, hkey, holder, p, window_start)
  redis.call('HDEL', hkey, holder)
  local unused = p.cost
  if unused <= 0 then
    return { 1 }
  end
  local raw = get_string(key)
  if p.algorithm == LEAKY then
    if not parse_state(raw, nil, 2) then
      return { 1 }
    end
    local _, _, _, _, _, _, _, level, anchor_us = leaky_values(raw, p.count, p.period_us, p.burst, p.delay, 0)
    level = level - unused
    if level < 0 then
      level = 0
    end
    local z = { value = fmt(level) .. ' ' .. int(anchor_us), expires_us = anchor_us + ceil_time_for(level, p.count, p.period_us) }
    lease_store(key, z)
  elseif p.algorithm == TOKEN then
    if not parse_state(raw, 't', 2) then
      return { 1 }
    end
    local z = token_bucket(key, with_cost(p, 0))
    local capacity = p.burst + 1
    local tokens = tonumber(z.n1) + unused
    if tokens > capacity then
      tokens = capacity
    end
    local anchor_us = z.n2
    lease_store(key, {
      value = 't ' .. fmt(tokens) .. ' ' .. int(anchor_us),
      expires_us = anchor_us + ceil_us(time_for_us(capacity - tokens, p.count, p.period_us)),
    })
  else
    local s = parse_state(raw, 'f', 2)
    if not s or window_start ~= s[1] or now >= s[1] + p.period_us then
      return { 1 }
    end
    local count = sat_sub(s[2], unused)
    lease_store(key, { value = 'f ' .. int(s[1]) .. ' ' .. int(count), expires_us = s[1] + p.period_us })
  end
  return { 1 }
end

-- The zone's six values at ARGV[base .. base + 5] (algorithm, count, period_us, burst, delay,
-- cost), or nil when they are malformed or the algorithm does not lease.
local function lease_params(base)
  local algorithm = tonumber(ARGV[base])
  local evaluate = algorithm and LEASED[algorithm]
  if not evaluate then
    return nil, 'lease: algorithm ' .. tostring(ARGV[base]) .. ' does not lease'
  end
  local p = {
    algorithm = algorithm,
    count = tonumber(ARGV[base + 1]),
    period_us = tonumber(ARGV[base + 2]),
    burst = tonumber(ARGV[base + 3]),
    delay = tonumber(ARGV[base + 4]),
    cost = tonumber(ARGV[base + 5]),
    evaluate = evaluate,
  }
  if not (p.count and p.count >= 0 and p.period_us and p.period_us >= 1 and p.burst and p.delay and p.cost
    and p.cost >= 0) then
    return nil, 'lease: malformed arguments'
  end
  return p
end

-- grants: one grant per key, in order, as if each were its own grant call at the same now (a
-- fleet's renewals of many keys in one round trip). ARGV[5] the number of grants n; grant i
-- (from 0) has the zone's six values, want and lifetime_us at ARGV[6 + 8i .. 13 + 8i] and its
-- keys at KEYS[1 + 2i], KEYS[2 + 2i]. Every grant is checked before any is made: a malformed
-- call changes nothing. Reply: the n grant replies.
local function lease_grants(holder)
  local n = tonumber(ARGV[5])
  if not (n and n >= 1 and n == math.floor(n) and #KEYS == 2 * n and #ARGV == 5 + 8 * n) then
    return redis.error_reply('lease: grants: expected n >= 1 grants of 2 keys and 8 values, got n '
      .. tostring(ARGV[5]) .. ', ' .. #KEYS .. ' keys, ' .. #ARGV .. ' values')
  end
  local asks = {}
  for i = 0, n - 1 do
    local base = 6 + 8 * i
    local p, err = lease_params(base)
    if not p then
      return redis.error_reply(err)
    end
    local want, lifetime_us = tonumber(ARGV[base + 6]), tonumber(ARGV[base + 7])
    if not (want and lifetime_us and lifetime_us >= 1) then
      return redis.error_reply('lease: grants: want and lifetime_us must be numbers')
    end
    asks[i + 1] = { p = p, want = want, lifetime_us = lifetime_us }
  end
  local replies = {}
  for i, ask in ipairs(asks) do
    replies[i] = lease_grant(KEYS[2 * i - 1], KEYS[2 * i], holder, ask.p, ask.want, ask.lifetime_us)
  end
  return replies
end

local function lease_call()
  local op, holder, now_text = ARGV[2], ARGV[3], ARGV[4]
  if not ((now_text == '' or tonumber(now_text)) and string.sub(holder or '', 1, 1) == 'i') then
    return redis.error_reply('lease: malformed arguments')
  end
  now = tonumber(now_text) or time_now()
  if op == 'grants' then
    return lease_grants(holder)
  end
  if #KEYS ~= 2 then
    return redis.error_reply('lease: expected 2 keys (state, holders), got ' .. #KEYS)
  end
  local p, err = lease_params(5)
  if not p then
    return redis.error_reply(err)
  end
  if op == 'grant' then
    local want, lifetime_us = tonumber(ARGV[11]), tonumber(ARGV[12])
    if not (want and lifetime_us and lifetime_us >= 1) then
      return redis.error_reply('lease: grant: want and lifetime_us must be numbers')
    end
    return lease_grant(KEYS[1], KEYS[2], holder, p, want, lifetime_us)
  elseif op == 'give' then
    return lease_give(KEYS[1], KEYS[2], holder, p, tonumber(ARGV[11]))
  end
  return redis.error_reply('lease: unknown operation ' .. tostring(op))
end

if ARGV[1] == 'lease' then
  return lease_call()
end
