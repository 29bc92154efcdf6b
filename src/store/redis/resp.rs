//! RESP2 frames of the decision lane (`lane.rs`): commands encoded straight into a reused buffer
//! and replies parsed from the read buffer as soon as they are complete, without redis-rs's
//! generic command and parser machinery on the hot path. Replies become `redis::Value`, so the
//! checked reply decoding of `limit_req.rs` is shared by both paths.

use ::redis::Value;

/// Nesting a reply may have: a batch of requests, a request, a zone, a sliding log's entries.
const MAX_DEPTH: usize = 6;
/// Largest element count or bulk length accepted from the server (a corrupt stream must not make
/// us allocate gigabytes).
const MAX_LEN: usize = 64 * 1024 * 1024;

/// A command under construction: `*<n>` is written when the argument count is known.
pub struct CommandWriter<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> CommandWriter<'a> {
    /// Starts a command of `args` arguments (the verb included).
    pub fn new(buf: &'a mut Vec<u8>, args: usize) -> Self {
        buf.push(b'*');
        buf.extend_from_slice(itoa::Buffer::new().format(args).as_bytes());
        buf.extend_from_slice(b"\r\n");
        Self { buf }
    }

    /// Continues a command whose header was written already.
    pub fn append(buf: &'a mut Vec<u8>) -> Self {
        Self { buf }
    }

    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.buf.push(b'$');
        self.buf.extend_from_slice(itoa::Buffer::new().format(value.len()).as_bytes());
        self.buf.extend_from_slice(b"\r\n");
        self.buf.extend_from_slice(value);
        self.buf.extend_from_slice(b"\r\n");
        self
    }

    pub fn int(&mut self, value: impl itoa::Integer) -> &mut Self {
        let mut digits = itoa::Buffer::new();
        self.bytes(digits.format(value).as_bytes())
    }

    /// `values` as bulk strings, copied from this thread's encoding of the same values when one of
    /// its last few is equal: a zone's arguments repeat from request to request, and encoding
    /// them anew cost ~110 instructions per argument.
    pub fn ints<const N: usize>(&mut self, values: &[i64; N]) -> &mut Self {
        RECENT_ARGS.with(|cell| {
            let mut recent = cell.borrow_mut();
            if let Some(hit) = recent.iter().position(|(v, _)| v[..] == values[..]) {
                self.buf.extend_from_slice(&recent[hit].1);
                recent[..=hit].rotate_right(1);
                return;
            }
            let start = self.buf.len();
            for &value in values {
                self.int(value);
            }
            let encoded = self.buf[start..].to_vec();
            if recent.len() == RECENT_ARGS_KEPT {
                recent.pop();
            }
            recent.insert(0, (values.to_vec(), encoded));
        });
        self
    }
}

/// How many distinct argument lists a thread keeps encoded (a route's zones, most recent first).
const RECENT_ARGS_KEPT: usize = 8;

thread_local! {
    static RECENT_ARGS: std::cell::RefCell<Vec<(Vec<i64>, Vec<u8>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// One parsed reply: a value, or the server's error line.
pub type Reply = Result<Value, String>;

/// A batch call's replies, one per request, or why its shape is wrong.
pub type Batch = Result<Vec<Reply>, String>;

/// A reply that the stream cannot contain: the connection must be dropped.
#[derive(Debug, PartialEq)]
pub struct Malformed(pub String);

/// Parses the reply at the start of `buf`: `Ok(None)` until it is complete, else the reply and
/// the bytes it took. An error nested in an array makes the whole reply that error.
pub fn parse(buf: &[u8]) -> Result<Option<(Reply, usize)>, Malformed> {
    let mut pos = 0;
    Ok(item(buf, &mut pos, 0)?.map(|reply| (reply, pos)))
}

/// Parses a batch call's reply (the layout of `lua/limit_req.lua` in batch mode): an array with,
/// per request, its reply as an array (the script's general path), or a counted run, an integer
/// `n` followed by the request's `n` values (the leaky-bucket path: a nested array per request
/// costs Redis a Lua table and its conversion each), or its error. Each request's reply comes out
/// as the single-call layout has it, an array, grouped while parsing (one allocation per request).
/// Anything but an array is returned as a single element (the call as a whole was refused). A run
/// of the wrong shape (a negative count, an error among its values, cut off by the end) leaves
/// the stream in step, so it is `Ok(Some((Err(why), used)))`: the batch fails, the connection
/// does not.
pub fn parse_batch(buf: &[u8]) -> Result<Option<(Batch, usize)>, Malformed> {
    let mut pos = 0;
    let Some(line) = line(buf, &mut pos)? else { return Ok(None) };
    if line.first() != Some(&b'*') {
        return Ok(parse(buf)?.map(|(reply, used)| (Ok(vec![reply]), used)));
    }
    let Some(n) = length(&line[1..])? else { return Ok(Some((Ok(vec![Ok(Value::Nil)]), pos))) };
    let mut out = Vec::with_capacity(n.min(1024));
    let mut shape: Option<String> = None;
    // The run being read: its values so far, and how many it still needs.
    let mut run: Option<(Vec<Value>, usize)> = None;
    for _ in 0..n {
        let Some(reply) = item(buf, &mut pos, 1)? else { return Ok(None) };
        if let Some((values, left)) = run.as_mut() {
            match reply {
                Ok(v) => values.push(v),
                Err(e) => {
                    shape.get_or_insert_with(|| format!("an error among a request's values in a batch reply: {e}"));
                }
            }
            *left -= 1;
            if *left == 0 {
                out.extend(run.take().map(|(values, _)| Ok(Value::Array(values))));
            }
            continue;
        }
        match reply {
            Ok(Value::Int(count)) => match usize::try_from(count) {
                Ok(0) => out.push(Ok(Value::Array(Vec::new()))),
                Ok(count) => run = Some((Vec::with_capacity(count.min(1024)), count)),
                Err(_) => {
                    shape.get_or_insert_with(|| format!("a batch reply announces {count} values"));
                }
            },
            other => out.push(other),
        }
    }
    if let Some((_, left)) = run {
        shape.get_or_insert_with(|| format!("a batch reply ends {left} values short of a request's"));
    }
    Ok(Some((shape.map_or(Ok(out), Err), pos)))
}

fn item(buf: &[u8], pos: &mut usize, depth: usize) -> Result<Option<Reply>, Malformed> {
    if depth > MAX_DEPTH {
        return Err(Malformed("reply nested too deeply".into()));
    }
    let Some(line) = line(buf, pos)? else { return Ok(None) };
    let (&kind, rest) = line.split_first().ok_or_else(|| Malformed("empty reply line".into()))?;
    let value = match kind {
        b':' => Value::Int(integer(rest)?),
        b'+' => Value::SimpleString(text(rest)),
        b'-' => return Ok(Some(Err(text(rest)))),
        b'$' => match length(rest)? {
            None => Value::Nil,
            Some(len) => {
                let end = *pos + len;
                if buf.len() < end + 2 {
                    return Ok(None);
                }
                if &buf[end..end + 2] != b"\r\n" {
                    return Err(Malformed("bulk string without its CRLF".into()));
                }
                let bytes = buf[*pos..end].to_vec();
                *pos = end + 2;
                Value::BulkString(bytes)
            }
        },
        b'*' => match length(rest)? {
            None => Value::Nil,
            Some(n) => {
                let mut elements = Vec::with_capacity(n.min(1024));
                let mut failed = None;
                for _ in 0..n {
                    match item(buf, pos, depth + 1)? {
                        None => return Ok(None),
                        Some(Ok(v)) => elements.push(v),
                        Some(Err(e)) => failed = failed.or(Some(e)),
                    }
                }
                if let Some(e) = failed {
                    return Ok(Some(Err(e)));
                }
                Value::Array(elements)
            }
        },
        other => return Err(Malformed(format!("unknown reply type byte 0x{other:02x}"))),
    };
    Ok(Some(Ok(value)))
}

/// The next CRLF-terminated line without its CRLF; `None` while incomplete.
fn line<'b>(buf: &'b [u8], pos: &mut usize) -> Result<Option<&'b [u8]>, Malformed> {
    let rest = &buf[(*pos).min(buf.len())..];
    let Some(cr) = rest.iter().position(|&b| b == b'\r') else {
        if rest.len() > 64 * 1024 {
            return Err(Malformed("reply line longer than 64 KiB".into()));
        }
        return Ok(None);
    };
    if rest.len() < cr + 2 {
        return Ok(None);
    }
    if rest[cr + 1] != b'\n' {
        return Err(Malformed("CR without LF".into()));
    }
    *pos += cr + 2;
    Ok(Some(&rest[..cr]))
}

/// RESP's integer text: an optional minus, then ASCII digits, without overflow (i64::MIN is
/// refused; no reply of ours comes near it). Parsed by hand: a reply carries a dozen per request.
fn integer(digits: &[u8]) -> Result<i64, Malformed> {
    let bad = || Malformed(format!("not an integer: {:?}", String::from_utf8_lossy(digits)));
    let (negative, body) = match digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, digits),
    };
    if body.is_empty() {
        return Err(bad());
    }
    // At most 18 digits cannot overflow: those (a reply's times have 16) skip the checks.
    let may_overflow = body.len() > 18;
    let mut n: i64 = 0;
    for &b in body {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return Err(bad());
        }
        n = match may_overflow {
            false => n * 10 + i64::from(digit),
            true => n.checked_mul(10).and_then(|n| n.checked_add(i64::from(digit))).ok_or_else(bad)?,
        };
    }
    Ok(if negative { -n } else { n })
}

/// A bulk or array length; `None` for RESP2's null (-1).
fn length(digits: &[u8]) -> Result<Option<usize>, Malformed> {
    match integer(digits)? {
        -1 => Ok(None),
        n if (0..=MAX_LEN as i64).contains(&n) => Ok(Some(n as usize)),
        n => Err(Malformed(format!("length {n} out of range"))),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(args: &[&[u8]]) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut w = CommandWriter::new(&mut buf, args.len());
        for a in args {
            w.bytes(a);
        }
        buf
    }

    #[test]
    fn integers_parse_like_the_standard_library() {
        let edges = ["999999999999999999", "-999999999999999999", "1000000000000000000", "000000000000000000001"];
        for text in ["0", "7", "-1", "1700000000000000", "9223372036854775807", "-9223372036854775807", "007"]
            .into_iter()
            .chain(edges)
        {
            assert_eq!(integer(text.as_bytes()), Ok(text.parse::<i64>().unwrap()), "{text}");
        }
        for bad in ["", "-", "+1", "1.5", "1e3", " 1", "9223372036854775808", "12a", "--1"] {
            assert!(integer(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn recently_encoded_arguments_are_the_same_bytes_as_fresh_ones() {
        // More distinct lists than are kept, revisited, so hits, misses and evictions all occur.
        let lists: Vec<[i64; 6]> = (0..12).map(|i| [i, -1, 1_000_000 * i, 20, i64::MAX - i, i % 3]).collect();
        for round in 0..3 {
            for (i, values) in lists.iter().enumerate().filter(|(i, _)| (i + round) % 2 == 0 || round == 2) {
                let mut cached = Vec::new();
                CommandWriter::append(&mut cached).ints(values);
                let mut fresh = Vec::new();
                for &v in values {
                    CommandWriter::append(&mut fresh).int(v);
                }
                assert_eq!(cached, fresh, "list {i}, round {round}");
            }
        }
    }

    #[test]
    fn commands_are_resp_arrays_of_bulk_strings() {
        assert_eq!(command(&[b"PING"]), b"*1\r\n$4\r\nPING\r\n");
        let mut buf = Vec::new();
        CommandWriter::new(&mut buf, 3).bytes(b"SET").bytes(b"").int(-12i64);
        assert_eq!(buf, b"*3\r\n$3\r\nSET\r\n$0\r\n\r\n$3\r\n-12\r\n");
    }

    #[test]
    fn replies_parse_only_when_complete() {
        let full = b"*3\r\n:1\r\n$3\r\nabc\r\n*2\r\n+OK\r\n$-1\r\n";
        for cut in 0..full.len() {
            assert_eq!(parse(&full[..cut]), Ok(None), "prefix of {cut} bytes");
        }
        let (reply, used) = parse(full).unwrap().unwrap();
        assert_eq!(used, full.len());
        assert_eq!(
            reply,
            Ok(Value::Array(vec![
                Value::Int(1),
                Value::BulkString(b"abc".to_vec()),
                Value::Array(vec![Value::SimpleString("OK".into()), Value::Nil]),
            ]))
        );
    }

    #[test]
    fn errors_are_per_element_in_a_batch_and_whole_inside_a_request() {
        let batch = b"*3\r\n*1\r\n:1\r\n-ERR one\r\n*3\r\n:2\r\n-ERR inner\r\n:9";
        assert_eq!(parse_batch(batch), Ok(None));
        let mut complete = batch.to_vec();
        complete.extend_from_slice(b"\r\n");
        let (replies, used) = parse_batch(&complete).unwrap().unwrap();
        assert_eq!(used, complete.len());
        assert_eq!(
            replies,
            Ok(vec![Ok(Value::Array(vec![Value::Int(1)])), Err("ERR one".into()), Err("ERR inner".into())])
        );
        let (single, _) = parse_batch(b"-NOSCRIPT x\r\n").unwrap().unwrap();
        assert_eq!(single, Ok(vec![Err("NOSCRIPT x".into())]));
    }

    #[test]
    fn corrupt_streams_are_refused() {
        assert!(parse(b"?x\r\n").is_err());
        assert!(parse(b"$3\r\nabcd\r\n").is_err());
        assert!(parse(b"*99999999999\r\n").is_err());
        assert!(parse(b":12a\r\n").is_err());
        let deep = "*1\r\n".repeat(10) + ":1\r\n";
        assert!(parse(deep.as_bytes()).is_err());
    }

    /// The batch reply `items` (a flat list of integers and nested replies) as RESP.
    fn batch(items: &[&str]) -> Vec<u8> {
        let mut buf = format!("*{}\r\n", items.len()).into_bytes();
        for i in items {
            buf.extend_from_slice(i.as_bytes());
        }
        buf
    }

    #[test]
    fn a_batch_reply_groups_counted_runs_nested_replies_and_errors_per_request() {
        // Request 1 a run of 2 values, request 2 nested, request 3 an error, request 4 a run of 0.
        let reply = batch(&[":2\r\n", ":1\r\n", ":0\r\n", "*1\r\n:7\r\n", "-limit_req: zone 1: bad\r\n", ":0\r\n"]);
        for cut in 0..reply.len() {
            assert_eq!(parse_batch(&reply[..cut]), Ok(None), "prefix of {cut} bytes");
        }
        let (each, used) = parse_batch(&reply).unwrap().unwrap();
        assert_eq!(used, reply.len());
        assert_eq!(
            each,
            Ok(vec![
                Ok(Value::Array(vec![Value::Int(1), Value::Int(0)])),
                Ok(Value::Array(vec![Value::Int(7)])),
                Err("limit_req: zone 1: bad".to_string()),
                Ok(Value::Array(vec![])),
            ])
        );
    }

    #[test]
    fn a_batch_reply_of_the_wrong_shape_fails_the_batch_not_the_stream() {
        // Values cut off; a negative count; an error among a request's values: each reply is
        // still consumed whole, so the next one parses.
        for items in [&[":3\r\n", ":1\r\n", ":2\r\n"][..], &[":-1\r\n"], &[":2\r\n", ":1\r\n", "-x\r\n"]] {
            let mut stream = batch(items);
            let first = stream.len();
            stream.extend_from_slice(&batch(&[":1\r\n", ":5\r\n"]));
            let (shape, used) = parse_batch(&stream).unwrap().unwrap();
            assert!(shape.is_err(), "{items:?}: {shape:?}");
            assert_eq!(used, first, "{items:?}");
            let (next, _) = parse_batch(&stream[used..]).unwrap().unwrap();
            assert_eq!(next, Ok(vec![Ok(Value::Array(vec![Value::Int(5)]))]));
        }
    }
}
