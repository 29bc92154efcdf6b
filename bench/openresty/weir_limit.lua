-- bench/openresty/weir_limit.lua: the OpenResty + Redis row of the benchmark (bench/README.md),
-- the way APISIX's and Kong's Redis-backed limits work: nginx's Lua module calls a Redis script per
-- request from `access_by_lua_block`, over a cosocket kept in nginx's keepalive pool.
--
-- The script is the very same lua/limit_req.lua Weir runs, called with the same KEYS/ARGV layout:
-- the harness captures Weir's own EVALSHA with MONITOR and passes its parts to configure() (from
-- `init_by_lua_block`): each KEYS[i] is `<prefix>{<client>}` with the client address nginx's
-- realip module took from X-Forwarded-For, and ARGV is Weir's as captured (ARGV[1] = "": the
-- script reads Redis's TIME). Reply [1] = 0: the request is rejected with 429.
--
-- lua-resty-redis is not packaged by Debian; it is a thin wrapper around ngx.socket.tcp, and this
-- file has the little of it the row needs: a RESP2 encoder (an array of bulk strings, sent as one
-- table of fragments) and a parser of RESP2 replies. A failed call (timeout, connection, an error
-- reply other than NOSCRIPT) is logged at warn with "limit store" in the line (the harness counts
-- such lines, as it does Weir's) and the request is let through (fail open, like Weir's default
-- `on_error = "allow"`).
--
-- With `headers = true` (row 8b) the row also does the rest of what Weir does for every request:
-- the IETF `RateLimit-Policy` / `RateLimit` fields on the response (set in header_filter from the
-- script's reply, the way APISIX's and Kong's limit plugins add their quota headers), while its
-- nginx.conf forwards X-Forwarded-For and X-Real-IP to the upstream.

local M = {}

local tcp = ngx.socket.tcp
local byte, sub = string.byte, string.sub
local tonumber = tonumber
local exit, var, log, WARN = ngx.exit, ngx.var, ngx.log, ngx.WARN
local ceil = math.ceil

local cfg -- port, sha, prefixes (KEYS[i] up to and including "{"), argv, script_path, timeout_ms, pool

function M.configure(c)
  local f = assert(io.open(c.script_path, "rb"))
  c.script = f:read("*a")
  f:close()
  c.timeout_ms = c.timeout_ms or 250  -- as the bench's Weir: every decision is made by Redis
  c.pool = c.pool or 64
  c.idle_ms = c.idle_ms or 60000
  c.nkeys = #c.prefixes
  c.numkeys = tostring(c.nkeys)
  cfg = c
end

-- One command as RESP: an array of bulk strings, as a table of fragments (sock:send takes it).
local function encode(args)
  local n = #args
  local buf, j = { "*", n, "\r\n" }, 3
  for i = 1, n do
    local a = args[i]
    buf[j + 1], buf[j + 2], buf[j + 3], buf[j + 4], buf[j + 5] = "$", #a, "\r\n", a, "\r\n"
    j = j + 5
  end
  return buf
end

-- One RESP2 reply. Returns the value (integers as numbers, bulk and simple strings as strings,
-- arrays as tables, nil bulk/array as ngx.null); an error reply as false, message; a network
-- error as nil, message.
local function read_reply(sock)
  local line, err = sock:receive() -- one line, CRLF removed
  if not line then
    return nil, err
  end
  local t = byte(line, 1)
  if t == 58 then -- ':'
    return tonumber(sub(line, 2))
  elseif t == 42 then -- '*'
    local n = tonumber(sub(line, 2))
    if n < 0 then
      return ngx.null
    end
    local arr = {}
    for i = 1, n do
      local v, e = read_reply(sock)
      if v == nil then
        return nil, e
      end
      arr[i] = v
    end
    return arr
  elseif t == 36 then -- '$'
    local n = tonumber(sub(line, 2))
    if n < 0 then
      return ngx.null
    end
    local data, e = sock:receive(n + 2)
    if not data then
      return nil, e
    end
    return sub(data, 1, n)
  elseif t == 43 then -- '+'
    return sub(line, 2)
  elseif t == 45 then -- '-'
    return false, sub(line, 2)
  end
  return nil, "unexpected reply: " .. line
end

local function call(sock, args)
  local ok, err = sock:send(encode(args))
  if not ok then
    return nil, err
  end
  return read_reply(sock)
end

function M.access()
  local c = cfg
  local client = var.remote_addr
  local args, n = { "EVALSHA", c.sha, c.numkeys }, 3
  for i = 1, c.nkeys do
    n = n + 1
    args[n] = c.prefixes[i] .. client .. "}"
  end
  local argv = c.argv
  for i = 1, #argv do
    n = n + 1
    args[n] = argv[i]
  end

  local sock = tcp()
  sock:settimeout(c.timeout_ms)
  local ok, err = sock:connect("127.0.0.1", c.port) -- reuses a pooled connection if there is one
  if not ok then
    log(WARN, "limit store: connect: ", err)
    return
  end
  local reply
  reply, err = call(sock, args)
  if reply == false and sub(err, 1, 8) == "NOSCRIPT" then
    -- Redis restarted or was flushed: run the script's text (its SHA is cached again).
    args[1], args[2] = "EVAL", c.script
    reply, err = call(sock, args)
  end
  if reply == nil then
    sock:close()
    log(WARN, "limit store: ", err)
    return
  end
  sock:setkeepalive(c.idle_ms, c.pool)
  if reply == false or type(reply) ~= "table" then
    log(WARN, "limit store: script: ", err or tostring(reply))
    return
  end
  local admitted = reply[1] == 1
  if c.headers then
    -- `RateLimit: "z1";r=..;t=..` as Weir words it for a one-zone request (engine/headers.rs):
    -- what is left and the seconds until the quota is whole, or 0 and the retry time if rejected.
    local r, t_us = reply[5], reply[6]
    if not admitted then
      r = 0
      if reply[3] >= 0 then
        t_us = reply[3]
      end
    end
    ngx.ctx.ratelimit = c.item .. ";r=" .. r .. ";t=" .. ceil(t_us / 1000000)
  end
  if not admitted then
    return exit(429)
  end
end

-- header_filter_by_lua (row 8b): the response's rate-limit fields.
function M.headers()
  local v = ngx.ctx.ratelimit
  if v then
    local h = ngx.header
    h["RateLimit-Policy"] = cfg.policy
    h["RateLimit"] = v
  end
end

return M
