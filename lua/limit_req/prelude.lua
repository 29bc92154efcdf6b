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
