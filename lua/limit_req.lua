-- limit_req.lua: every `limit_req` zone of one request, decided atomically, each zone with its own
-- algorithm.
--
-- This is `limit::decide_all` (src/limit/verdict.rs, dispatching like src/limit/state.rs to
-- leaky_bucket.rs, token_bucket.rs, fixed_window.rs, sliding_log.rs and sliding_window.rs) in Lua.
-- Every expression keeps the Rust operand order, so both round identically and agree bit for bit
-- (tests/lua_differential.rs). Change one, change the other. Lua numbers are doubles: every integer
-- here (µs since the epoch, counts, costs) stays below 2^53, where double arithmetic is exact, and
-- `a % b` (Lua 5.1: a - floor(a/b)*b) is exact for 0 <= a < 2^53.
--
-- One script, written as parts: lua/limit_req/ holds prelude.lua (this protocol, the constants,
-- arithmetic and clock every algorithm shares), one part per algorithm named after it, zone.lua
-- (what the general path's algorithms share) and dispatch.lua (read the arguments, evaluate each
-- zone with its algorithm, combine, write all or nothing, reply; the batch mode). Weir joins them
-- in the order of src/store/redis/script.rs (prelude, leaky_bucket, zone, token_bucket,
-- fixed_window, sliding_window, sliding_log, lease, dispatch) and loads the result as ONE script: one
-- SHA, one EVALSHA. lua/limit_req.lua is that joined script, kept for what runs it outside Weir
-- (the bench, redis-cli); a test fails when it differs from the parts. Edit the parts, then
-- rewrite it: `WEIR_WRITE_LUA=1 cargo test --lib store::redis::script`.
-- The order is a cost: Redis runs a script's body on every call, so the leaky bucket's fast paths
-- (in its part) return before the later parts define their functions.
--
-- lease.lua's calls (ARGV[1] = "lease": the grants and give-backs of leased zones) have their own
-- layout, in its header.
--
-- KEYS[i]  state key of zone i: `<prefix><zone>:{<client key>}` (store::redis_key).
-- ARGV[1]  now, integer µs since the Unix epoch; "" = use Redis TIME (one clock for the fleet).
-- ARGV[2]  flags. First character: how much the reply says (layouts below): "0" the compact
--          reply (what the proxy reads), "1" the full reply, the sliding log's entry times
--          included (O(entries) per zone; for tests and debugging).
--          Then, optionally (Redis Cluster, zones of one request spread over several hash slots,
--          one call per slot; see src/store/redis/limit_req.rs):
--            "u"  undo: append to the reply, for every key written, what lua/restore.lua needs to
--                 put the key's previous value back (the reply's last element, see below);
--            "n"  evaluate only: write nothing, even if every zone admits (the request was already
--                 rejected in another slot; this call only completes the verdict).
--            "c"  charge after the response (docs/charges.md, cost_from_response): a leaky-bucket
--                 zone that has no room for its cost is charged the whole units that fit below its
--                 ceiling instead (the burst sent is the reference's burst plus the debt cap), so
--                 the charge is never refused (`leaky_bucket::charge`). Other algorithms decide
--                 as usual.
-- then 6 values per zone i, at ARGV[3 + 6*(i-1)] ...:
--   algorithm  Algorithm::id(): 0 leaky_bucket, 1 token_bucket, 2 fixed_window, 3 sliding_log,
--              4 sliding_window
--   count      rate numerator: `count` requests (windows: the limit per window) ...
--   period_us  ... per `period_us` µs (buckets: 1e6, 6e7 or 3.6e9; windows: the window)
--   burst      nginx `burst`, requests (buckets; 0 for windows)
--   delay      nginx `delay=`, requests; -1 = `nodelay` (leaky bucket only)
--   cost       requests this request counts as
--
-- State per key: each algorithm's part states its format (a string, or the sliding log's sorted set).
-- A wrong type or another algorithm's value counts as no state, like `limit::evaluate`; an admitted
-- request overwrites it, so a reload that changes a zone's algorithm never breaks a key.
-- Fractions are written with %.17g so they parse back to the same double (in Lua and in Rust).
-- Each key gets a TTL of ceil((expires_us - now) / 1 ms) + 1 ms, from the model's `expires_us`,
-- after which its state equals no state: the key outlives its state by 1 to 2 ms, so an absent key
-- is always an expired one (the memory store forgets at `expires_us`). A key holding another type
-- is read with redis.pcall, which Redis counts in its error stats (only after such a reload).
-- A rejected request writes nothing, not even the trim of expired log entries (nginx: rejected
-- requests are free; a flood of rejections costs no writes, replication or AOF). Expired log
-- entries are trimmed (ZREMRANGEBYSCORE) by the next admitted request of the key; until then they
-- are skipped when counting. Only KEYS[] are touched.
--
-- Compact reply (flag "0"; integers, -1 = "none"):
--   [1] admitted 0|1   [2] delay_us   [3] retry_after_us (rejected: largest retry of the rejecting
--   zones, -1 if one of them never admits; admitted: -1)   [4] now_us used
--   then 5 values per zone i, at [5 + 5*(i-1)] ...: admitted 0|1, delay_us, retry_us (-1:
--   admitted, or never), remaining, reset_us. A request of one zone gets only its remaining and
--   reset_us ([5], [6]): its admitted, delay and retry are [1] to [3].
-- Full reply (flag "1"): [1] to [4] as above, then
--   [4 + i] zone i, an array:
--     [1] algorithm id   [2] admitted 0|1   [3] excess (string)   [4] delay_us
--     [5] retry_us (-1: admitted, or never)   [6] remaining   [7] reset_us   [8] expires_us
--     [9...] next, the state the zone stores if the whole request is admitted (when rejected:
--       the current state, which is not stored), in the layout its algorithm's part states
-- With flag "u", either reply has one more element: an array with one undo record per key written
-- (none if nothing was written), each an array: the key's index in KEYS, then the ARGV of that key
-- for lua/restore.lua (kind, written, anchor, prev_kind, prev, prev_pttl, m, members...; layout in
-- its header).
-- Fractions travel as %.17g strings because Redis truncates Lua numbers to integers.

local HEAD_ARGS = 2
local ZONE_ARGS = 6
local LEAKY, TOKEN, FIXED, LOG, SLIDING = 0, 1, 2, 3, 4

-- Set by `decide` for the request being decided; the functions below read them.
local now, want_log

local function fmt(x)
  if x > 0 and x < 9007199254740992 and x % 1 == 0 then
    -- The same text, cheaper: %.17g writes a whole number below 2^53 as its digits.
    return string.format('%d', x)
  end
  return string.format('%.17g', x)
end

-- An integer as digits: tostring() of a Lua number switches to exponent notation above 1e14.
local function int(x)
  return string.format('%d', x)
end

-- Rate::time_for_us: `requests * period_us / count`, left to right.
local function time_for_us(requests, count, period_us)
  return requests * period_us / count
end

-- Rate::drained_in: `(elapsed_us * count) / period_us`.
local function drained_in(elapsed_us, count, period_us)
  return (elapsed_us * count) / period_us
end

-- state::ceil_us
local function ceil_us(us)
  if us > 0 then
    return math.ceil(us)
  end
  return 0
end

-- ceil_us(time_for_us(...)) in one call (the leaky bucket's, which makes it per zone up to 3 times).
local ceil, floor = math.ceil, math.floor
local function ceil_time_for(requests, count, period_us)
  local us = requests * period_us / count
  if us > 0 then
    return ceil(us)
  end
  return 0
end

-- u64::saturating_sub
local function sat_sub(a, b)
  if a > b then
    return a - b
  end
  return 0
end

-- Redis TIME in µs, read once per call: the requests of a batch are decided at one instant, as
-- one atomic call is.
local redis_now
local function time_now()
  if not redis_now then
    -- Before Redis 5 a script that reads TIME must replicate its effects, not itself; since 7.0
    -- this is the default and the function is a deprecated no-op (or absent).
    if redis.replicate_commands then
      pcall(redis.replicate_commands)
    end
    local t = redis.call('TIME')
    redis_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return redis_now
end

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

-- lua/limit_req/zone.lua: what the algorithms of the general path share (after the leaky
-- bucket's fast paths): a zone's result, a key's string, a stored string's numbers.

-- One zone's result. Every field is set here, in one constructor: a Lua table that grows is
-- rehashed, and this runs for every zone of every request. `n1`..`n3` are `next` (the reply's
-- layout); `value` is the string state stored (false for the sliding log); `p` the zone's
-- parameters (set by `decide`).
local function zone_result(excess)
  return {
    admitted = false, excess = excess, delay_us = 0, retry_us = -1, remaining = 0, reset_us = 0,
    expires_us = 0, value = false, n1 = false, n2 = false, n3 = false, p = false,
  }
end

-- The string value of a key; nil when absent or not a string (a sorted set of the sliding log).
local function get_string(key)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'string' then
    return raw
  end
  return nil
end

-- `n` numbers from a stored string, after `tag` (nil: untagged); nil for anything else, so another
-- algorithm's value (or garbage) counts as no state.
local function parse_state(raw, tag, n)
  if not raw then
    return nil
  end
  local words = {}
  for word in string.gmatch(raw, '[^ ]+') do
    words[#words + 1] = word
  end
  local first = 1
  if tag then
    if words[1] ~= tag then
      return nil
    end
    first = 2
  end
  if #words ~= first - 1 + n then
    return nil
  end
  local out = {}
  for j = 1, n do
    local x = tonumber(words[first - 1 + j])
    if not x then
      return nil
    end
    out[j] = x
  end
  return out
end

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

-- lua/limit_req/fixed_window.lua: src/limit/fixed_window.rs in Lua.
-- State: string "f <start_us> <count>" (WindowState's stored text). Full reply's next: start_us,
-- count.

-- fixed_window::evaluate
local function fixed_window(key, p)
  local window, limit_count, cost = p.period_us, p.count, p.cost
  local aligned = now - now % window
  local s = parse_state(get_string(key), 'f', 2)
  local start_us, used
  -- A late clock never moves a key back to an earlier window (start > aligned).
  if s and s[1] >= aligned then
    start_us, used = s[1], s[2]
  else
    start_us, used = aligned, 0
  end
  local end_us = start_us + window
  local z = zone_result(0)
  z.reset_us, z.expires_us = sat_sub(end_us, now), end_us
  local stored
  if used + cost > limit_count then
    z.admitted = false
    z.excess = used + cost - limit_count
    -- A block (limit 0) names the window's end, like fixed_window.rs.
    if cost <= limit_count or limit_count == 0 then
      z.retry_us = z.reset_us
    end
    stored = used
  else
    z.admitted = true
    z.excess = 0
    stored = used + cost
    z.remaining = limit_count - stored
  end
  z.n1, z.n2 = start_us, stored
  z.value = 'f ' .. int(start_us) .. ' ' .. int(stored)
  return z
end

-- lua/limit_req/sliding_window.lua: src/limit/sliding_window.rs in Lua.
-- State: string "s <start_us> <prev> <curr>" (SlidingState's stored text). Full reply's next:
-- start_us, prev, curr.

-- sliding_window::retry_us
local function sliding_retry_us(allowed, prev, curr, elapsed, window)
  local window_f = window
  if curr <= allowed and prev > 0 then
    local t = window_f - (allowed - curr) * window_f / prev
    return ceil_us(t - elapsed)
  end
  local t = 0
  if curr > 0 then
    t = window_f - allowed * window_f / curr
  end
  return ceil_us((window - elapsed) + t)
end

-- sliding_window::evaluate
local function sliding_window(key, p)
  local window, cost = p.period_us, p.cost
  local aligned = now - now % window
  local s = parse_state(get_string(key), 's', 3)
  local start_us, prev, curr
  if s and s[1] == aligned then
    start_us, prev, curr = s[1], s[2], s[3]
  elseif s and s[1] + window == aligned then
    start_us, prev, curr = aligned, s[3], 0
  elseif s and s[1] > aligned then
    -- A late clock keeps the key in its newer window.
    start_us, prev, curr = s[1], s[2], s[3]
  else
    start_us, prev, curr = aligned, 0, 0
  end
  local elapsed = sat_sub(now, start_us)
  local window_f = window
  local estimate = prev * (window - elapsed) / window_f + curr
  local limit_f = p.count
  local expires_us = start_us + 2 * window
  local z = zone_result(0)
  z.reset_us, z.expires_us = sat_sub(expires_us, now), expires_us
  local stored
  if estimate + cost > limit_f then
    z.admitted = false
    z.excess = estimate + cost - limit_f
    if p.count == 0 then
      -- A block: the current window's end, like sliding_window.rs.
      z.retry_us = sat_sub(start_us + window, now)
    elseif cost <= p.count then
      z.retry_us = sliding_retry_us(limit_f - cost, prev, curr, elapsed, window)
    end
    stored = curr
  else
    z.admitted = true
    z.excess = 0
    local room = math.floor(limit_f - estimate - cost)
    if room > 0 then
      z.remaining = room
    end
    stored = curr + cost
  end
  z.n1, z.n2, z.n3 = start_us, prev, stored
  z.value = 's ' .. int(start_us) .. ' ' .. int(prev) .. ' ' .. int(stored)
  return z
end

-- lua/limit_req/sliding_log.lua: src/limit/sliding_log.rs in Lua, and the log's write (called by
-- dispatch.lua's `persist`).
-- State: sorted set, one member per admitted cost unit: score = admission time (µs), member
-- "<time>" for the first entry of that time, then "<time>:1", "<time>:2", ... (members of one time
-- expire together, so the next n is their count; an integer member takes 8 bytes in a listpack
-- instead of a string's 19). After a rollback (lua/restore.lua) removed one from the middle, a
-- taken name is skipped (ZADD NX), so each entry keeps a member of its own. Full reply's next:
-- number of entries, array of the entry times oldest first (with flag "1" only: `want_log`).

-- ZADD members per call: unpack() is limited by the Lua C stack (8000 values).
local ZADD_BATCH = 1000

-- The score of the member at `rank` (0 = oldest, -1 = newest).
local function score_at(key, rank)
  local r = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  return tonumber(r[2])
end

-- sliding_log::evaluate. Entries t with t + window <= now have expired: they are counted out with
-- ZCOUNT (O(log n)) and trimmed when an admitted request writes.
local function sliding_log(key, p)
  local window, limit_count, cost = p.period_us, p.count, p.cost
  local card = redis.pcall('ZCARD', key)
  local z = {
    admitted = false, excess = 0, delay_us = 0, retry_us = -1, remaining = 0, reset_us = 0,
    expires_us = 0, value = false, n1 = false, n2 = false, n3 = false, p = false,
    log = true, wrong_type = false, anchor_us = 0, newest = false, expired = 0,
  }
  local expired, newest = 0, nil
  if type(card) ~= 'number' then
    -- Another algorithm's string: no state; an admitted request replaces it.
    z.wrong_type, card = true, 0
  elseif card > 0 then
    expired = redis.call('ZCOUNT', key, '-inf', int(now - window))
    newest = score_at(key, -1)
  end
  -- Entries are sorted; a late clock stamps new entries at the newest time, keeping them sorted.
  -- (An expired newest entry is older than now, so counting it here changes nothing.)
  local anchor_us = now
  if newest and newest > now then
    anchor_us = newest
  end
  local used = card - expired
  z.anchor_us, z.newest, z.expired = anchor_us, newest, expired

  local live = {}
  if want_log and used > 0 then
    local r = redis.call('ZRANGEBYSCORE', key, '(' .. int(now - window), '+inf', 'WITHSCORES')
    for j = 2, #r, 2 do
      live[#live + 1] = tonumber(r[j])
    end
  end

  if used + cost > limit_count then
    z.admitted = false
    z.excess = used + cost - limit_count
    if cost <= limit_count then
      -- Making room for `cost` needs the `used + cost - limit` oldest live entries to expire.
      local k = used + cost - limit_count
      z.retry_us = sat_sub(score_at(key, expired + k - 1) + window, now)
    end
    if used > 0 then
      z.expires_us = newest + window
    else
      z.expires_us = now
    end
    z.reset_us = sat_sub(z.expires_us, now)
    z.n1, z.n2 = used, live
    return z
  end
  z.admitted = true
  z.excess = 0
  z.remaining = limit_count - used - cost
  z.expires_us = anchor_us + window
  z.reset_us = z.expires_us - now
  if want_log then
    for _ = 1, cost do
      live[#live + 1] = anchor_us
    end
  end
  z.n1, z.n2 = used + cost, live
  return z
end

-- Stores an admitted sliding log: trims the expired entries, adds `cost` entries at `anchor_us`.
-- Returns the member names added when `record` is set (for an undo record), else an empty table.
local function write_log(key, z, p, ttl_ms, record)
  if z.wrong_type then
    redis.call('DEL', key)
  elseif z.expired > 0 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - p.period_us))
  end
  local cost = p.cost
  local added = {}
  if cost > 0 then
    local anchor = int(z.anchor_us)
    local n = 0
    if z.newest == z.anchor_us then
      -- Members of this time already exist (the newest is live: it is not before now).
      n = redis.call('ZCOUNT', key, anchor, anchor)
    end
    if n == 0 then
      local j = 0
      while j < cost do
        local args = {}
        local upto = math.min(cost, j + ZADD_BATCH)
        while j < upto do
          local member = anchor
          if j > 0 then
            member = anchor .. ':' .. int(j)
          end
          args[#args + 1] = anchor
          args[#args + 1] = member
          if record then
            added[#added + 1] = member
          end
          j = j + 1
        end
        redis.call('ZADD', key, unpack(args))
      end
    else
      -- The next free name is usually "<time>:<n>"; but a rollback (lua/restore.lua) may have
      -- removed a member from the middle, so a name may be taken: add one at a time, NX, and skip
      -- the taken ones.
      local idx, j = n, 0
      while j < cost do
        local member = anchor .. ':' .. int(idx)
        if redis.call('ZADD', key, 'NX', anchor, member) == 1 then
          j = j + 1
          if record then
            added[#added + 1] = member
          end
        end
        idx = idx + 1
      end
    end
  end
  -- A no-op when the log is empty (nothing live, nothing added): the key is gone, as it should be.
  redis.call('PEXPIRE', key, ttl_ms)
  return added
end

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
