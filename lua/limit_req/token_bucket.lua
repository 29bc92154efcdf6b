-- lua/limit_req/token_bucket.lua: src/limit/token_bucket.rs in Lua.
-- State: string "t <tokens> <last_us>" (TokenState's stored text). Full reply's next: tokens
-- (string), last_us.

-- token_bucket::evaluate
local function token_bucket(key, p)
  local count, period_us, cost = p.count, p.period_us, p.cost
  local capacity = p.burst + 1
  local s = parse_state(get_string(key), 't', 2)
  local tokens_now, anchor_us
  if not s then
    tokens_now, anchor_us = capacity, now
  elseif now <= s[2] then
    -- Time never runs backwards for a key: a late clock refills nothing.
    tokens_now, anchor_us = s[1], s[2]
  elseif now >= s[2] + ceil_us(time_for_us(capacity - s[1], count, period_us)) then
    -- Full again (the state's expiry): exactly no state, whatever the float residue.
    tokens_now, anchor_us = capacity, now
  else
    local refilled = s[1] + drained_in(now - s[2], count, period_us)
    if refilled < capacity then
      tokens_now = refilled
    else
      tokens_now = capacity
    end
    anchor_us = now
  end

  local z = zone_result(0)
  local tokens
  if cost > tokens_now then
    z.admitted = false
    z.excess = cost - tokens_now
    if cost <= capacity then
      z.retry_us = ceil_us(time_for_us(cost - tokens_now, count, period_us))
    end
    tokens = tokens_now
  else
    z.admitted = true
    z.excess = 0
    tokens = tokens_now - cost
    z.remaining = math.floor(tokens)
  end
  z.reset_us = ceil_us(time_for_us(capacity - tokens, count, period_us))
  z.expires_us = anchor_us + z.reset_us
  local tokens_text = fmt(tokens)
  z.n1, z.n2 = tokens_text, anchor_us
  z.value = 't ' .. tokens_text .. ' ' .. int(anchor_us)
  return z
end
