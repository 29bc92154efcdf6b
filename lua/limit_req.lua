-- limit_req.lua: nginx `limit_req` for every zone of one request, decided atomically.
--
-- This is `limit::decide_all` (src/limit/verdict.rs over src/limit/leaky_bucket.rs) in Lua. Every
-- expression keeps the Rust operand order, so both round identically and agree bit for bit
-- (tests/lua_differential.rs). Change one, change the other.
--
-- KEYS[i]  state key of zone i: `<prefix><zone>:{<client key>}` (store::redis_key).
-- ARGV[1]  now, integer µs since the Unix epoch; "" = use Redis TIME (one clock for the fleet).
-- then 5 values per zone i, at ARGV[2 + 5*(i-1)] ...:
--   count      rate numerator: `count` requests ...
--   period_us  ... per `period_us` µs (1e6, 6e7 or 3.6e9: r/s, r/m, r/h)
--   burst      nginx `burst`, requests
--   delay      nginx `delay=`, requests; -1 = `nodelay`
--   cost       requests this request counts as
--
-- State per key: the string "<level> <last_us>": `level` requests in the bucket at `last_us` µs.
-- `level` is written with %.17g so it parses back to the same double (in Lua and in Rust).
-- It is set with a TTL that ends when the bucket has drained, so an absent key is a drained one.
-- A rejected request writes nothing (nginx: rejected requests are free). Only KEYS[] are touched.
--
-- Reply (integers unless noted; -1 = "none"):
--   [1] admitted 0|1   [2] delay_us   [3] retry_after_us (rejected: largest retry of the rejecting
--   zones, -1 if one of them never admits; admitted: -1)   [4] now_us used
--   then 8 values per zone, from [5 + 8*(i-1)]:
--   admitted 0|1, excess (string), delay_us, retry_us (-1: admitted, or never), remaining,
--   reset_us, next level (string), next last_us
--   "next" is the state the zone stores if the whole request is admitted (when rejected: the
--   state drained to now, which is not stored).
-- Fractions travel as %.17g strings because Redis truncates Lua numbers to integers.

local ZONE_ARGS = 5

if #ARGV ~= 1 + ZONE_ARGS * #KEYS then
  return redis.error_reply('limit_req: expected ' .. (1 + ZONE_ARGS * #KEYS) .. ' ARGV for '
    .. #KEYS .. ' keys, got ' .. #ARGV)
end

local now
if ARGV[1] == '' then
  -- Before Redis 5 a script that reads TIME must replicate its effects, not itself; since 7.0
  -- this is the default and the function is a deprecated no-op (or absent).
  if redis.replicate_commands then
    pcall(redis.replicate_commands)
  end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
  if not now then
    return redis.error_reply('limit_req: ARGV[1] is not a number of µs')
  end
end

local function fmt(x)
  return string.format('%.17g', x)
end

-- Rate::time_for_us: `requests * period_us / count`, left to right.
local function time_for_us(requests, count, period_us)
  return requests * period_us / count
end

-- leaky_bucket::ceil_us
local function ceil_us(us)
  if us > 0 then
    return math.ceil(us)
  end
  return 0
end

-- "<level> <last_us>" -> level, last_us; nil for anything else (an unknown value is treated as
-- no state, and is overwritten by the next admitted request).
local function parse_state(raw)
  if not raw then
    return nil
  end
  local sp = string.find(raw, ' ', 1, true)
  if not sp then
    return nil
  end
  local level = tonumber(string.sub(raw, 1, sp - 1))
  local last_us = tonumber(string.sub(raw, sp + 1))
  if not level or not last_us then
    return nil
  end
  return level, last_us
end

-- leaky_bucket::evaluate for zone i.
local function evaluate(i)
  local base = 1 + ZONE_ARGS * (i - 1)
  local count = tonumber(ARGV[base + 1])
  local period_us = tonumber(ARGV[base + 2])
  local burst = tonumber(ARGV[base + 3])
  local delay = tonumber(ARGV[base + 4])
  local cost = tonumber(ARGV[base + 5])

  local level_now, anchor_us
  local level, last_us = parse_state(redis.call('GET', KEYS[i]))
  if not level then
    level_now, anchor_us = 0, now
  elseif now <= last_us then
    -- The clock went backwards: keep the stored time and drain nothing.
    level_now, anchor_us = level, last_us
  else
    -- Rate::drained_in: `(elapsed_us * count) / period_us`.
    local l = level - ((now - last_us) * count) / period_us
    if l > 0 then
      level_now = l
    else
      level_now = 0
    end
    anchor_us = now
  end

  local capacity = burst + 1
  local level_new = level_now + cost
  local excess = level_new - 1
  local z = { excess = excess, anchor_us = anchor_us }

  if excess > burst then
    local room_needed = level_now - (capacity - cost)
    z.admitted = false
    z.delay_us = 0
    if cost <= capacity then
      z.retry_us = ceil_us(time_for_us(room_needed, count, period_us))
    else
      z.retry_us = -1
    end
    z.remaining = 0
    z.reset_us = ceil_us(time_for_us(level_now, count, period_us))
    z.level = level_now
    return z
  end

  z.admitted = true
  z.delay_us = 0
  if delay >= 0 and excess > delay then
    z.delay_us = ceil_us(time_for_us(excess - delay, count, period_us))
  end
  z.retry_us = -1
  local room = math.floor(capacity - level_new)
  if room > 0 then
    z.remaining = room
  else
    z.remaining = 0
  end
  z.reset_us = ceil_us(time_for_us(level_new, count, period_us))
  z.level = level_new
  return z
end

-- verdict::decide_all: evaluate every zone, then write all or none.
local zones = {}
local admitted = true
for i = 1, #KEYS do
  zones[i] = evaluate(i)
  if not zones[i].admitted then
    admitted = false
  end
end

local delay_us, retry_after_us = 0, -1
if admitted then
  for i = 1, #KEYS do
    local z = zones[i]
    if z.delay_us > delay_us then
      delay_us = z.delay_us
    end
    -- Keep the key until its bucket is empty: `reset_us` after `anchor_us`, which is later than
    -- now if the clock went backwards (the memory store expires at the same instant).
    local ttl_ms = math.ceil((z.reset_us + (z.anchor_us - now)) / 1000) + 1
    -- %d: tostring() of a Lua number switches to exponent notation above 1e14.
    redis.call('SET', KEYS[i], fmt(z.level) .. string.format(' %d', z.anchor_us),
      'PX', string.format('%d', ttl_ms))
  end
else
  local never = false
  retry_after_us = 0
  for i = 1, #KEYS do
    local z = zones[i]
    if not z.admitted then
      if z.retry_us < 0 then
        never = true
      elseif z.retry_us > retry_after_us then
        retry_after_us = z.retry_us
      end
    end
  end
  if never then
    retry_after_us = -1
  end
end

local reply = { admitted and 1 or 0, delay_us, retry_after_us, now }
for i = 1, #KEYS do
  local z = zones[i]
  local n = #reply
  reply[n + 1] = z.admitted and 1 or 0
  reply[n + 2] = fmt(z.excess)
  reply[n + 3] = z.delay_us
  reply[n + 4] = z.retry_us
  reply[n + 5] = z.remaining
  reply[n + 6] = z.reset_us
  reply[n + 7] = fmt(z.level)
  reply[n + 8] = z.anchor_us
end
return reply
