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
