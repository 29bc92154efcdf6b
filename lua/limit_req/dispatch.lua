-- lua/limit_req/dispatch.lua: one request's zones evaluated, each by its algorithm (EVALUATE),
-- combined, written all or nothing, and the reply; the entry point, one request or a batch.
-- A new algorithm adds its id (prelude.lua) and its `evaluate` to EVALUATE below.

-- What a key holds before this call writes it (flag "u"), for lua/restore.lua: prev_kind, prev,
-- prev_pttl. `kind` is what the call writes: 's' a string, 'z' sliding-log entries (which are
-- added to a sorted set already there, so that one is not copied).
local function snapshot(key, kind)
  local t = redis.call('TYPE', key)
  t = t.ok or t
  if t == 'none' then
    return 'n', '', -1
  end
  local pttl = redis.call('PTTL', key)
  if t == 'string' then
    return 's', redis.call('GET', key), pttl
  end
  if t == 'zset' and kind == 'z' then
    return 'z', '', pttl
  end
  return 'd', redis.call('DUMP', key), pttl
end

local EVALUATE = {
  [LEAKY] = leaky_bucket,
  [TOKEN] = token_bucket,
  [FIXED] = fixed_window,
  [LOG] = sliding_log,
  [SLIDING] = sliding_window,
}

-- Verdict::combine: admitted only if every zone admits; the largest delay; when rejected, the
-- largest retry of the rejecting zones (-1 if one of them never admits).
local function combine(zones)
  local admitted = true
  for i = 1, #zones do
    if not zones[i].admitted then
      admitted = false
    end
  end
  if admitted then
    local delay_us = 0
    for i = 1, #zones do
      if zones[i].delay_us > delay_us then
        delay_us = zones[i].delay_us
      end
    end
    return true, delay_us, -1
  end
  local retry_after_us = 0
  for i = 1, #zones do
    local z = zones[i]
    if not z.admitted then
      if z.retry_us < 0 then
        return false, 0, -1
      elseif z.retry_us > retry_after_us then
        retry_after_us = z.retry_us
      end
    end
  end
  return false, 0, retry_after_us
end

-- The store's write of an admitted request (memory store: `decide_now` inserting every
-- `zone.next`): each key's new state with a TTL of its expiry; with `want_undo`, what
-- lua/restore.lua needs to put each key back. Zone i's key is keys[k0 + i]. Returns the undo
-- records (nil without `want_undo`).
local function persist(keys, k0, zones, want_undo)
  local undo = want_undo and {} or nil
  for i = 1, #zones do
    local z, key = zones[i], keys[k0 + i]
    -- A key given twice (one zone referenced twice) stores the last zone's state, as the memory
    -- store does.
    local last = true
    for j = i + 1, #zones do
      if keys[k0 + j] == key then
        last = false
      end
    end
    if last then
      -- Keep the key until its state expires: `expires_us`, rounded up to ms, plus 1 ms.
      local ttl_ms = int(math.ceil((z.expires_us - now) / 1000) + 1)
      local kind = z.log and 'z' or 's'
      local record
      if want_undo then
        local prev_kind, prev, prev_pttl = snapshot(key, kind)
        record = { i, kind, '', '', prev_kind, prev, prev_pttl, 0 }
      end
      if z.log then
        local added = write_log(key, z, z.p, ttl_ms, want_undo)
        if record then
          record[4] = int(z.anchor_us)
          record[8] = #added
          for _, member in ipairs(added) do
            record[#record + 1] = member
          end
        end
      else
        redis.call('SET', key, z.value, 'PX', ttl_ms)
        if record then
          record[3] = z.value
        end
      end
      if record then
        undo[#undo + 1] = record
      end
    end
  end
  return undo
end

-- The reply's values for zone i (layouts in the header of prelude.lua).
local function append_compact(reply, z)
  local n = #reply
  reply[n + 1] = z.admitted and 1 or 0
  reply[n + 2] = z.delay_us
  reply[n + 3] = z.retry_us
  reply[n + 4] = z.remaining
  reply[n + 5] = z.reset_us
end

local function full_zone(algorithm, z)
  local out = {
    algorithm, z.admitted and 1 or 0, fmt(z.excess), z.delay_us, z.retry_us, z.remaining,
    z.reset_us, z.expires_us, z.n1, z.n2,
  }
  if z.n3 then
    out[11] = z.n3
  end
  return out
end

-- ARGV[2] read once per call for each distinct value (a batch's requests share theirs).
local flags_seen = {}
local function parsed_flags(flags)
  local f = flags_seen[flags]
  if not f then
    f = {
      full = string.sub(flags, 1, 1) == '1',
      undo = string.find(flags, 'u', 2, true) ~= nil,
      evaluate_only = string.find(flags, 'n', 2, true) ~= nil,
      charge = string.find(flags, 'c', 2, true) ~= nil,
    }
    flags_seen[flags] = f
  end
  return f
end

-- One request's arguments, read from argv[a0 + 1 ...] (the layout of ARGV in the header of prelude.lua): an
-- error message, or nil and the clock argument (nil: Redis TIME), the flags and every zone's
-- parameters. Read once, they serve every request of a batch that sends the same arguments (see
-- the batch mode below).
local function read_args(nkeys, argv, a0)
  local now_text = argv[a0 + 1]
  if now_text ~= '' and not tonumber(now_text) then
    return 'limit_req: ARGV[1] is not a number of µs'
  end
  local params = {}
  for i = 1, nkeys do
    local base = a0 + HEAD_ARGS + ZONE_ARGS * (i - 1)
    local algorithm = tonumber(argv[base + 1])
    local evaluate = algorithm and EVALUATE[algorithm]
    if not evaluate then
      return 'limit_req: zone ' .. i .. ': unknown algorithm ' .. tostring(argv[base + 1])
    end
    local p = {
      algorithm = algorithm,
      count = tonumber(argv[base + 2]),
      period_us = tonumber(argv[base + 3]),
      burst = tonumber(argv[base + 4]),
      delay = tonumber(argv[base + 5]),
      cost = tonumber(argv[base + 6]),
      evaluate = evaluate,
    }
    -- count 0 (a block) only for fixed_window (2) and sliding_window (4), as the config allows.
    local least = (algorithm == 2 or algorithm == 4) and 0 or 1
    if not (p.count and p.count >= least and p.period_us and p.period_us >= 1 and p.burst and p.delay and p.cost) then
      return 'limit_req: zone ' .. i .. ': count, period_us, burst, delay, cost must be numbers'
    end
    params[i] = p
  end
  return nil, tonumber(now_text), parsed_flags(argv[a0 + 2]), params
end

-- leaky_bucket::charge for the zones of a charge (flag "c") that refused their cost: each is
-- evaluated again with the whole units that fit below its ceiling (the level now is the refused
-- evaluation's `next`). Parameters may be shared by a batch's requests: copied, not changed.
local function charge_what_fits(keys, k0, zones)
  for i = 1, #zones do
    local z = zones[i]
    local p = z.p
    if not z.admitted and p.algorithm == LEAKY then
      local room = math.floor(p.burst + 1 - tonumber(z.n1))
      if room < 0 then
        room = 0
      end
      local q = {}
      for k, v in pairs(p) do
        q[k] = v
      end
      q.cost = room
      z = leaky_bucket(keys[k0 + i], q)
      z.p = q
      zones[i] = z
    end
  end
end

-- verdict::decide_all for one request: evaluate every zone, combine, then write all or none.
-- Its keys are keys[k0 + 1 ...], the rest what read_args returned (a zone's parameters are only
-- read, so requests with equal arguments share them).
local function decide(keys, k0, err, now_arg, f, params)
  if err then
    return redis.error_reply(err)
  end
  now = now_arg or time_now()
  want_log = f.full
  local full, want_undo, evaluate_only = f.full, f.undo, f.evaluate_only

  local zones = {}
  for i = 1, #params do
    local p = params[i]
    local z = p.evaluate(keys[k0 + i], p)
    z.p = p
    zones[i] = z
  end
  if f.charge then
    charge_what_fits(keys, k0, zones)
  end

  local admitted, delay_us, retry_after_us = combine(zones)
  local undo
  if admitted and not evaluate_only then
    undo = persist(keys, k0, zones, want_undo)
  end

  if #zones == 1 and not full then
    -- One zone: its admitted, delay and retry are the request's.
    local z = zones[1]
    local reply = { admitted and 1 or 0, delay_us, retry_after_us, now, z.remaining, z.reset_us }
    if want_undo then
      reply[7] = undo or {}
    end
    return reply
  end
  local reply = { admitted and 1 or 0, delay_us, retry_after_us, now }
  for i = 1, #zones do
    if full then
      reply[#reply + 1] = full_zone(params[i].algorithm, zones[i])
    else
      append_compact(reply, zones[i])
    end
  end
  if want_undo then
    reply[#reply + 1] = undo or {}
  end
  return reply
end

-- One request (ARGV as in the header of prelude.lua), or a batch of independent requests decided one after
-- the other in this one atomic call (src/store/redis/lane.rs): ARGV[1] = "batch", ARGV[2] = the
-- number of requests, then per request its number of keys n followed by either its 2 + 6n
-- arguments in the single layout, or "=" when they equal the previous request's (same clock
-- argument, flags, zones and costs: the usual batch, read once); KEYS holds every request's keys
-- in order. The reply is an array with, per request, its reply (an array) or its error: one
-- request's error never affects another's. (The leaky-bucket path in leaky_bucket.lua writes each request's
-- reply flat instead: its number of values, then the values, in the same array.)
if ARGV[1] ~= 'batch' then
  local expected = HEAD_ARGS + ZONE_ARGS * #KEYS
  if #ARGV ~= expected then
    return redis.error_reply('limit_req: expected ' .. expected .. ' ARGV for ' .. #KEYS .. ' keys, got ' .. #ARGV)
  end
  return decide(KEYS, 0, read_args(#KEYS, ARGV, 0))
end
local requests = tonumber(ARGV[2])
if not requests then
  return redis.error_reply('limit_req: batch: ARGV[2] is not a number of requests')
end
local replies = {}
local next_key, next_arg = 1, 3
local err, now_arg, flags, params, args_keys
for r = 1, requests do
  local nkeys = tonumber(ARGV[next_arg])
  if not nkeys or nkeys < 1 or next_key + nkeys - 1 > #KEYS then
    return redis.error_reply('limit_req: batch: request ' .. r .. ' has a bad key count')
  end
  if ARGV[next_arg + 1] == '=' then
    if args_keys ~= nkeys then
      return redis.error_reply('limit_req: batch: request ' .. r .. ' repeats arguments it cannot have')
    end
    next_arg = next_arg + 2
  else
    local nargs = HEAD_ARGS + ZONE_ARGS * nkeys
    if next_arg + nargs > #ARGV then
      return redis.error_reply('limit_req: batch: request ' .. r .. ' has too few arguments')
    end
    err, now_arg, flags, params = read_args(nkeys, ARGV, next_arg)
    args_keys = nkeys
    next_arg = next_arg + 1 + nargs
  end
  local ok, reply = pcall(decide, KEYS, next_key - 1, err, now_arg, flags, params)
  next_key = next_key + nkeys
  if ok then
    replies[r] = reply
  else
    replies[r] = { err = tostring(reply) }
  end
end
return replies
