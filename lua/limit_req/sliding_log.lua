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
