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
