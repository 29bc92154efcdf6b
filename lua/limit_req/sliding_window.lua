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
