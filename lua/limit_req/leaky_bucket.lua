-- lua/limit_req/leaky_bucket.lua: nginx's leaky bucket (GCRA), src/limit/leaky_bucket.rs in Lua;
-- its charge after the response (flag "c") is dispatch.lua's `charge_what_fits`.
-- State: string "<level> <last_us>" (untagged: the format of earlier versions; BucketState's
-- stored text). Full reply's next: level (string), last_us.
-- nginx's algorithm is the usual call, so this part also holds the two fast paths that decide a
-- call of leaky buckets only and return before the rest of the script defines its functions.

-- leaky_bucket::evaluate on a stored value `raw` (nil: none): admitted, excess, delay_us,
-- retry_us (-1: admitted, or never), remaining, reset_us, expires_us, and `next` (level,
-- anchor_us). Untagged "<level> <last_us>" (parse_state's split: exactly two words, each a
-- number); anything else is no state.
local function leaky_values(raw, count, period_us, burst, delay, cost)
  local s1, s2
  if raw then
    s1, s2 = string.match(raw, '^ *([^ ]+) +([^ ]+) *$')
    s1, s2 = tonumber(s1), tonumber(s2)
  end
  local level_now, anchor_us
  if not (s1 and s2) then
    level_now, anchor_us = 0, now
  elseif now <= s2 then
    -- The clock went backwards: keep the stored time and drain nothing.
    level_now, anchor_us = s1, s2
  elseif now >= s2 + ceil_time_for(s1, count, period_us) then
    -- Drained (the state's expiry): exactly no state, whatever the float residue.
    level_now, anchor_us = 0, now
  else
    local l = s1 - drained_in(now - s2, count, period_us)
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
  local admitted, delay_us, retry_us, remaining, level = false, 0, -1, 0, level_now
  if excess > burst then
    if cost <= capacity then
      retry_us = ceil_time_for(level_now - (capacity - cost), count, period_us)
    end
  else
    admitted = true
    if delay >= 0 and excess > delay then
      delay_us = ceil_time_for(excess - delay, count, period_us)
    end
    local room = floor(capacity - level_new)
    if room > 0 then
      remaining = room
    end
    level = level_new
  end
  local reset_us = ceil_time_for(level, count, period_us)
  return admitted, excess, delay_us, retry_us, remaining, reset_us, anchor_us + reset_us, level, anchor_us
end

-- A lone request of one leaky-bucket zone with the compact reply, in the single-call layout: the
-- lane's call when there is nothing to batch (a steady, moderate rate). Decided here, before the
-- leaky path below builds its parameter, result and reply arrays and its closure: the same
-- `leaky_values`, then what the leaky path stores and replies for one zone (Redis instructions
-- per call, bench/lua_cost.py --single: see bench/results/rls-2026-11-27.md). Anything else, or
-- anything malformed, goes on to the leaky path.
if #KEYS == 1 and #ARGV == HEAD_ARGS + ZONE_ARGS and ARGV[2] == '0' and ARGV[3] == '0' then
  local now_text = ARGV[1]
  local now_arg = tonumber(now_text)
  local count, period_us = tonumber(ARGV[4]), tonumber(ARGV[5])
  local burst, delay, cost = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
  if (now_arg or now_text == '') and count and count >= 1 and period_us and period_us >= 1
    and burst and delay and cost then
    now = now_arg or time_now()
    local key = KEYS[1]
    local raw = redis.pcall('GET', key)
    if type(raw) ~= 'string' then
      raw = nil
    end
    local admitted, _, delay_us, retry_us, remaining, reset_us, expires_us, level, anchor_us =
      leaky_values(raw, count, period_us, burst, delay, cost)
    if not admitted then
      return { 0, 0, retry_us, now, remaining, reset_us }
    end
    redis.call('SET', key, fmt(level) .. ' ' .. int(anchor_us), 'PX', int(ceil((expires_us - now) / 1000) + 1))
    return { 1, delay_us, -1, now, remaining, reset_us }
  end
end

-- The leaky-bucket path: a call whose every zone is a leaky bucket, with the compact ("0") or
-- full ("1") reply, no undo, no evaluate-only, and in batch mode every request after the first
-- saying "=" (the usual call: nginx's algorithm, one server, a lane's batch). It decides exactly
-- as `decide` in dispatch.lua (the same `leaky_values`, then `combine`, `persist` and the reply,
-- written out for this one algorithm), but runs before the later parts define their ~25
-- functions (Redis runs a script's body on every call), reads the arguments and the clock once
-- per call, keeps the zones' results in one array reused by every request (Lua tables cost
-- Redis more than anything else a decision does: ~1.4k instructions each, with their garbage
-- collection), and formats a number only when it differs from the previous one of its kind. Any
-- other call, or anything malformed, returns nil here and takes the general path (which words
-- the errors).
local function leaky_path()
  local batch = ARGV[1] == 'batch'
  local requests, a0, n = 1, 0, #KEYS
  if batch then
    a0 = 3
  end
  if ARGV[a0 + HEAD_ARGS + 1] ~= '0' then
    return nil -- the first zone is no leaky bucket: the general path, at once
  end
  if batch then
    requests, n = tonumber(ARGV[2]), tonumber(ARGV[3])
    if not (requests and requests >= 1 and n and n >= 1 and #KEYS >= requests * n)
      or #ARGV ~= 3 + HEAD_ARGS + ZONE_ARGS * n + 2 * (requests - 1) then
      return nil
    end
    -- (Compared as text: tonumber costs a strtod. Other texts of the same number, or anything
    -- else, take the general path.)
    local n_text = ARGV[3]
    for at = 4 + HEAD_ARGS + ZONE_ARGS * n, #ARGV, 2 do
      if ARGV[at] ~= n_text or ARGV[at + 1] ~= '=' then
        return nil
      end
    end
  elseif n < 1 or #ARGV ~= HEAD_ARGS + ZONE_ARGS * n then
    return nil
  end
  local now_text, flags = ARGV[a0 + 1], ARGV[a0 + 2]
  if flags ~= '0' and flags ~= '1' then
    return nil
  end
  -- Every zone a leaky bucket? (As text, before any number is parsed: the general path pays
  -- next to nothing more for its calls.)
  for i = 1, n do
    if ARGV[a0 + HEAD_ARGS + ZONE_ARGS * (i - 1) + 1] ~= '0' then
      return nil
    end
  end
  local now_arg = tonumber(now_text)
  if now_text ~= '' and not now_arg then
    return nil
  end
  local full = flags == '1'
  -- p[i]: count, period_us, burst, delay, cost of zone i (checked as read_args does; one
  -- constructor each, which sizes the table once).
  local p = {}
  for i = 1, n do
    local base = a0 + HEAD_ARGS + ZONE_ARGS * (i - 1)
    local count, period_us = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
    local burst, delay, cost = tonumber(ARGV[base + 4]), tonumber(ARGV[base + 5]), tonumber(ARGV[base + 6])
    if not (count and count >= 1 and period_us and period_us >= 1 and burst and delay and cost) then
      return nil
    end
    p[i] = { count, period_us, burst, delay, cost }
  end
  now = now_arg or time_now()

  -- The previous TTL and state written, and their text.
  local ttl_x, ttl_t, level_x, anchor_x, value_t
  -- Zone i's admitted, excess, delay_us, retry_us, remaining, reset_us, expires_us, level and
  -- anchor_us at zr[9*(i-1) + 1 ...].
  local zr = { false, false, false, false, false, false, false, false, false } -- sized for one zone
  -- The reply; in batch mode each request's reply is its number of values, then the values (or
  -- one error instead of both), one after the other in one array: a nested array per request
  -- would cost a Lua table and its conversion each.
  local out, o = { nil, nil, nil, nil, nil, nil, nil }, 0 -- sized for one request of one zone

  local function one(k0)
    for i = 1, n do
      local q, zt = p[i], 9 * (i - 1)
      local raw = redis.pcall('GET', KEYS[k0 + i])
      if type(raw) ~= 'string' then
        raw = nil
      end
      zr[zt + 1], zr[zt + 2], zr[zt + 3], zr[zt + 4], zr[zt + 5], zr[zt + 6], zr[zt + 7], zr[zt + 8], zr[zt + 9] =
        leaky_values(raw, q[1], q[2], q[3], q[4], q[5])
    end
    -- combine, in one pass: admitted only if every zone admits; the largest delay; when rejected,
    -- the largest retry of the rejecting zones, -1 if one of them never admits.
    local admitted, delay_us, retry_after_us, never = true, 0, 0, false
    for zt = 0, 9 * (n - 1), 9 do
      if zr[zt + 1] then
        if zr[zt + 3] > delay_us then
          delay_us = zr[zt + 3]
        end
      else
        admitted = false
        local retry_us = zr[zt + 4]
        if retry_us < 0 then
          never = true
        elseif retry_us > retry_after_us then
          retry_after_us = retry_us
        end
      end
    end
    if admitted then
      retry_after_us = -1
      -- persist: a key given twice stores the last zone's state.
      for i = 1, n do
        local key, last, zt = KEYS[k0 + i], true, 9 * (i - 1)
        for j = i + 1, n do
          if KEYS[k0 + j] == key then
            last = false
          end
        end
        if last then
          local ttl_ms, level, anchor_us = ceil((zr[zt + 7] - now) / 1000) + 1, zr[zt + 8], zr[zt + 9]
          if ttl_ms ~= ttl_x then
            ttl_x, ttl_t = ttl_ms, int(ttl_ms)
          end
          if level ~= level_x or anchor_us ~= anchor_x then
            level_x, anchor_x, value_t = level, anchor_us, fmt(level) .. ' ' .. int(anchor_us)
          end
          redis.call('SET', key, value_t, 'PX', ttl_t)
        end
      end
    else
      delay_us = 0
      if never then
        retry_after_us = -1
      end
    end
    local c = batch and o + 1 or o
    out[c + 1], out[c + 2], out[c + 3], out[c + 4] = admitted and 1 or 0, delay_us, retry_after_us, now
    local m
    if full then
      for i = 1, n do
        local zt = 9 * (i - 1)
        out[c + 4 + i] = {
          LEAKY, zr[zt + 1] and 1 or 0, fmt(zr[zt + 2]), zr[zt + 3], zr[zt + 4], zr[zt + 5], zr[zt + 6],
          zr[zt + 7], fmt(zr[zt + 8]), zr[zt + 9],
        }
      end
      m = 4 + n
    elseif n == 1 then
      -- One zone: its admitted, delay and retry are the request's.
      out[c + 5], out[c + 6] = zr[5], zr[6]
      m = 6
    else
      for i = 1, n do
        local at, zt = c + 5 * i, 9 * (i - 1)
        out[at], out[at + 1], out[at + 2], out[at + 3], out[at + 4] =
          zr[zt + 1] and 1 or 0, zr[zt + 3], zr[zt + 4], zr[zt + 5], zr[zt + 6]
      end
      m = 4 + 5 * n
    end
    if batch then
      out[o + 1] = m
    end
    o = c + m
  end

  if not batch then
    one(0)
    return out
  end
  for r = 1, requests do
    local ok, err = pcall(one, (r - 1) * n)
    if not ok then
      o = o + 1
      out[o] = { err = tostring(err) }
    end
  end
  return out
end

do
  local reply = leaky_path()
  if reply then
    return reply
  end
end

-- leaky_bucket::evaluate, as a zone result (`leaky_values` does the arithmetic) for the general
-- path in dispatch.lua. Defined here, after the fast paths returned, and so before zone.lua: it
-- builds zone.lua's `zone_result(0)` and reads zone.lua's `get_string(key)` itself (the same
-- table, the same GET).
local function leaky_bucket(key, p)
  local z = {
    admitted = false, excess = 0, delay_us = 0, retry_us = -1, remaining = 0, reset_us = 0,
    expires_us = 0, value = false, n1 = false, n2 = false, n3 = false, p = false,
  }
  local raw = redis.pcall('GET', key)
  if type(raw) ~= 'string' then
    raw = nil
  end
  local level, anchor_us
  z.admitted, z.excess, z.delay_us, z.retry_us, z.remaining, z.reset_us, z.expires_us, level, anchor_us =
    leaky_values(raw, p.count, p.period_us, p.burst, p.delay, p.cost)
  local level_text = fmt(level) -- formatted once: %.17g costs more than the bucket's arithmetic
  z.n1, z.n2 = level_text, anchor_us
  z.value = level_text .. ' ' .. int(anchor_us)
  return z
end
