-- restore.lua: takes back what one call of limit_req.lua (flag "u") charged, for a request that a
-- later call rejected.
--
-- On a Redis Cluster the zones of one request live in as many hash slots as the request has
-- distinct client keys (keys are `<prefix><zone>:{<client key>}`), and one script call can only
-- touch one slot. The store (src/store/redis/limit_req.rs) then calls limit_req.lua once per
-- slot, in order; each admitted call writes its zones and returns, per key written, the value the
-- key held before. If a later slot rejects, the request must have charged nothing, so this script
-- is called, once per slot already charged, with those undo records.
--
-- KEYS[i]  a key the charging call wrote (all in one slot).
-- ARGV     per key, in KEYS order: 7 values, then `m` member names:
--   kind       's': the call SET a string (leaky/token bucket, fixed/sliding window);
--              'z': it added entries to a sliding log (a sorted set)
--   written    's': the string it wrote; '' for 'z'
--   anchor     'z': the entries' time, µs; '' for 's'
--   prev_kind  what the key held before: 'n' nothing, 's' a string, 'z' the sorted set the
--              entries were added to, 'd' anything else (then `prev` is its DUMP)
--   prev       's': the string, 'd': the DUMP payload; else ''
--   prev_pttl  the key's PTTL then, ms (-1: no expiry)
--   m          'z': the number of entries added, followed by their member names; 0 for 's'
-- Reply: the number of keys fully put back.
--
-- What it does, key by key:
--   's': if the key still holds exactly the string the call wrote, it gets its previous value (or
--        is deleted if it had none) with its previous PTTL.
--   'z': the entries the call added are removed (exact whatever else happened meanwhile: each
--        request's entries have their own member names). If the set is gone and the key held
--        another algorithm's value before, that value is put back. If the set remains and no
--        entry newer than the removed ones was added, it gets its previous PTTL back.
--
-- The race window, honestly: between the charging call and this one (one round trip per slot in
-- between, plus this call's own), other requests see the charge. One of them may be rejected, or
-- see less `remaining`, although this request ends up charging nothing: limits err on the strict
-- side, never the loose one. If such a request also wrote a 's' key, the key no longer holds what
-- this call wrote and is left alone: the charge of the rejected request stays in that zone until
-- its state drains (strict again). If the proxy dies, times out or loses Redis between the calls,
-- the charge stays too. A key put back lives its previous PTTL from now, i.e. a few ms longer than
-- it would have; expired log entries that the charging call trimmed are not put back (they no
-- longer count anyway). Only KEYS[] are touched.

local function put_back(key, prev_kind, prev, prev_pttl)
  if prev_kind == 'n' then
    redis.call('DEL', key)
  elseif prev_kind == 's' then
    if prev_pttl > 0 then
      redis.call('SET', key, prev, 'PX', prev_pttl)
    else
      redis.call('SET', key, prev)
    end
  elseif prev_kind == 'd' then
    redis.call('DEL', key)
    local ttl = 0
    if prev_pttl > 0 then
      ttl = prev_pttl
    end
    redis.call('RESTORE', key, ttl, prev)
  end
end

local ZREM_BATCH = 1000
local pos = 1
local restored = 0
for i = 1, #KEYS do
  local key = KEYS[i]
  local kind, written, anchor = ARGV[pos], ARGV[pos + 1], ARGV[pos + 2]
  local prev_kind, prev, prev_pttl = ARGV[pos + 3], ARGV[pos + 4], tonumber(ARGV[pos + 5])
  local m = tonumber(ARGV[pos + 6])
  if not (kind and prev_pttl and m) then
    return redis.error_reply('restore: key ' .. i .. ': expected kind, written, anchor, prev_kind, prev, '
      .. 'prev_pttl, m and m members')
  end
  local first_member = pos + 7
  pos = first_member + m
  if kind == 's' then
    local current = redis.pcall('GET', key)
    if type(current) == 'string' and current == written then
      put_back(key, prev_kind, prev, prev_pttl)
      restored = restored + 1
    end
  elseif kind == 'z' then
    local removed = 0
    local t = redis.call('TYPE', key)
    t = t.ok or t
    if t == 'zset' then
      local j = first_member
      while j < pos do
        local upto = math.min(pos, j + ZREM_BATCH)
        removed = removed + redis.call('ZREM', key, unpack(ARGV, j, upto - 1))
        j = upto
      end
    end
    if redis.call('EXISTS', key) == 0 then
      if prev_kind == 's' or prev_kind == 'd' then
        put_back(key, prev_kind, prev, prev_pttl)
      end
    elseif t == 'zset' and prev_kind == 'z' and prev_pttl > 0 then
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      if newest[2] and tonumber(newest[2]) < tonumber(anchor) then
        redis.call('PEXPIRE', key, prev_pttl)
      end
    end
    if removed == m then
      restored = restored + 1
    end
  else
    return redis.error_reply('restore: key ' .. i .. ': unknown kind ' .. tostring(kind))
  end
end
return restored
