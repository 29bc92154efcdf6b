-- bench/wrk/client.lua: the one wrk script of the benchmark harness (bench/harness.py).
--
-- Every request carries `X-Forwarded-For: 10.a.b.c`, the client address that Weir (with
-- `[real_ip] trusted = ["127.0.0.1/32"]`) and nginx (`set_real_ip_from 127.0.0.1`) use as the
-- limit key. Behaviour is chosen with environment variables, read once per wrk thread:
--
--   WRK_KEYS=N        cycle over N distinct addresses, requests built once in init() (default 10000;
--                     1 = one-key flood / fleet accuracy)
--   WRK_KEY_OFFSET=K  first address is number K (so separate runs can use fresh keys)
--   WRK_SEQUENTIAL=1  build each request on the fly from a counter instead of a table: N distinct
--                     addresses without holding N requests in memory (the 1M-key memory test)
--   WRK_DELAY_MS=D    wait D ms after each response before the next request on that connection
--                     (wrk has no rate control; C connections then offer about C*1000/(D+latency) r/s)
--   WRK_COUNT=1       count response statuses (200, 429, other), and keep the first and last
--                     `X-Upstream-Msec` seen (the upstream's clock, stamped on admitted requests by
--                     the harness's /fleet location); costs a header parse per response
--
-- done() prints one line, `WRKJSON {...}`, that the harness parses: requests, duration, errors,
-- latency percentiles in µs (including p99.9, which `wrk --latency` does not print), and the
-- status counts summed over threads.

local threads = {}

-- Address number i -> "10.a.b.c" (16M addresses: 10.0.0.0/8).
local function addr(i)
  local a = math.floor(i / 65536) % 256
  local b = math.floor(i / 256) % 256
  local c = i % 256
  return string.format("10.%d.%d.%d", a, b, c)
end

local function env_number(name, default)
  local v = os.getenv(name)
  if v == nil or v == "" then
    return default
  end
  return tonumber(v)
end

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  nkeys = env_number("WRK_KEYS", 10000)
  offset = env_number("WRK_KEY_OFFSET", 0)
  sequential = os.getenv("WRK_SEQUENTIAL") == "1"
  next_key = 0
  c200, c429, cother = 0, 0, 0
  first_s, last_s = -1, -1

  if not sequential then
    -- Pre-built requests: request() is then a table lookup, so wrk spends its core on I/O.
    reqs = {}
    for k = 0, nkeys - 1 do
      reqs[k + 1] = wrk.format("GET", wrk.path, { ["X-Forwarded-For"] = addr(offset + k) })
    end
  end

  local delay_ms = env_number("WRK_DELAY_MS", 0)
  if delay_ms > 0 then
    -- Jitter of ±1 ms keeps the connections from falling into lock step.
    delay = function()
      return delay_ms + math.random(-1, 1)
    end
  end

  if os.getenv("WRK_COUNT") == "1" then
    -- Defined only when asked: wrk parses headers for Lua only if response() exists.
    response = function(status, headers, body)
      if status == 200 then
        c200 = c200 + 1
        local stamp = tonumber(headers["X-Upstream-Msec"] or headers["x-upstream-msec"] or "")
        if stamp then
          if first_s < 0 or stamp < first_s then first_s = stamp end
          if stamp > last_s then last_s = stamp end
        end
      elseif status == 429 then
        c429 = c429 + 1
      else
        cother = cother + 1
      end
    end
  end
end

function request()
  local k = next_key
  next_key = (next_key + 1) % nkeys
  if sequential then
    return wrk.format("GET", wrk.path, { ["X-Forwarded-For"] = addr(offset + k) })
  end
  return reqs[k + 1]
end

function done(summary, latency, requests)
  local s200, s429, sother, first, last = 0, 0, 0, -1, -1
  for _, t in ipairs(threads) do
    s200 = s200 + (t:get("c200") or 0)
    s429 = s429 + (t:get("c429") or 0)
    sother = sother + (t:get("cother") or 0)
    local f, l = t:get("first_s") or -1, t:get("last_s") or -1
    if f >= 0 and (first < 0 or f < first) then first = f end
    if l > last then last = l end
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"mean":%.1f,"max":%d,"p50":%d,"p75":%d,"p90":%d,"p99":%d,"p99_9":%d},' ..
    '"status":{"200":%d,"429":%d,"other":%d},"upstream_s":{"first":%.3f,"last":%.3f}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency.max,
    latency:percentile(50), latency:percentile(75), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9),
    s200, s429, sother, first, last))
end
