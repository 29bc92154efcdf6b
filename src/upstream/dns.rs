//! A minimal DNS client for `resolver = "IP:port"` (nginx's `resolver`): one A and one AAAA query
//! over UDP, answers read defensively (every length is checked; nothing in a reply can panic).
//! Records' TTLs are not used: names are resolved again every `resolve_interval`.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const MAX_REPLY: usize = 4096;

static NEXT_ID: AtomicU16 = AtomicU16::new(0x5eed);

/// The addresses of `host` (A, then AAAA records) asked of `server`; an empty list when the name
/// exists without addresses.
pub fn lookup(host: &str, server: SocketAddr, timeout: Duration) -> io::Result<Vec<IpAddr>> {
    let v4 = query(host, TYPE_A, server, timeout);
    if matches!(&v4, Err(e) if e.kind() == io::ErrorKind::NotFound) {
        return v4;
    }
    // Some servers refuse AAAA queries: one of the two answering is enough.
    match (v4, query(host, TYPE_AAAA, server, timeout)) {
        (Ok(mut a), Ok(aaaa)) => {
            a.extend(aaaa);
            Ok(a)
        }
        (Ok(a), Err(_)) | (Err(_), Ok(a)) => Ok(a),
        (Err(e), Err(_)) => Err(e),
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("DNS reply: {what}"))
}

fn query(host: &str, qtype: u16, server: SocketAddr, timeout: Duration) -> io::Result<Vec<IpAddr>> {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let packet = encode(id, host, qtype)?;
    let bind: SocketAddr = if server.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let socket = UdpSocket::bind(bind)?;
    socket.set_read_timeout(Some(timeout))?;
    socket.connect(server)?;
    socket.send(&packet)?;
    let mut buf = [0u8; MAX_REPLY];
    loop {
        let n = socket.recv(&mut buf)?;
        // A stray or late datagram for another query: keep waiting for ours.
        if let Some(answer) = decode(&buf[..n], id, qtype)? {
            return Ok(answer);
        }
    }
}

fn encode(id: u16, host: &str, qtype: u16) -> io::Result<Vec<u8>> {
    let mut p = Vec::with_capacity(host.len() + 18);
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]); // recursion desired, one question
    for label in host.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{host:?} is not a DNS name")));
        }
        p.push(label.len() as u8);
        p.extend_from_slice(label.as_bytes());
    }
    p.push(0);
    p.extend_from_slice(&qtype.to_be_bytes());
    p.extend_from_slice(&1u16.to_be_bytes()); // class IN
    Ok(p)
}

/// `Ok(None)`: not the reply to query `id`.
fn decode(reply: &[u8], id: u16, qtype: u16) -> io::Result<Option<Vec<IpAddr>>> {
    let u16_at = |i: usize| reply.get(i..i + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    let (Some(rid), Some(flags), Some(qd), Some(an)) = (u16_at(0), u16_at(2), u16_at(4), u16_at(6)) else {
        return Err(bad("shorter than its header"));
    };
    if rid != id || flags & 0x8000 == 0 {
        return Ok(None);
    }
    match flags & 0x000f {
        0 => {}
        3 => return Err(io::Error::new(io::ErrorKind::NotFound, "no such name (NXDOMAIN)")),
        code => return Err(bad(&format!("error code {code}"))),
    }
    let mut at = 12;
    for _ in 0..qd {
        at = skip_name(reply, at)? + 4;
    }
    let mut out = Vec::new();
    for _ in 0..an {
        at = skip_name(reply, at)?;
        let (Some(rtype), Some(len)) = (u16_at(at), u16_at(at + 8)) else {
            return Err(bad("truncated record"));
        };
        let data = reply.get(at + 10..at + 10 + len as usize).ok_or_else(|| bad("truncated record data"))?;
        match (rtype, data.len()) {
            (TYPE_A, 4) if qtype == TYPE_A => out.push(IpAddr::V4(Ipv4Addr::new(data[0], data[1], data[2], data[3]))),
            (TYPE_AAAA, 16) if qtype == TYPE_AAAA => {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(data);
                out.push(IpAddr::V6(Ipv6Addr::from(octets)));
            }
            _ => {} // CNAME and others: the addresses follow as their own records
        }
        at += 10 + len as usize;
    }
    Ok(Some(out))
}

/// The offset just past the (possibly compressed) name at `at`.
fn skip_name(reply: &[u8], mut at: usize) -> io::Result<usize> {
    loop {
        let len = *reply.get(at).ok_or_else(|| bad("truncated name"))?;
        match len {
            0 => return Ok(at + 1),
            l if l & 0xc0 == 0xc0 => return Ok(at + 2),
            l if l & 0xc0 == 0 => at += 1 + l as usize,
            _ => return Err(bad("bad label")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(id: u16, answers: &[(u16, &[u8])]) -> Vec<u8> {
        let mut p = encode(id, "app.test", TYPE_A).unwrap();
        p[2] = 0x81;
        p[3] = 0x80;
        p[7] = answers.len() as u8;
        for (t, data) in answers {
            p.extend_from_slice(&[0xc0, 0x0c]);
            p.extend_from_slice(&t.to_be_bytes());
            p.extend_from_slice(&[0, 1, 0, 0, 0, 30]);
            p.extend_from_slice(&(data.len() as u16).to_be_bytes());
            p.extend_from_slice(data);
        }
        p
    }

    #[test]
    fn decodes_a_records_and_skips_others() {
        let r = reply(7, &[(5, b"\x03foo\x00"), (TYPE_A, &[10, 0, 0, 1]), (TYPE_A, &[10, 0, 0, 2])]);
        let got = decode(&r, 7, TYPE_A).unwrap().unwrap();
        assert_eq!(got, vec![IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2])]);
        assert!(decode(&r, 8, TYPE_A).unwrap().is_none(), "another query's reply");
    }

    #[test]
    fn never_panics_on_truncated_replies() {
        let r = reply(7, &[(TYPE_A, &[10, 0, 0, 1])]);
        for n in 0..r.len() {
            let _ = decode(&r[..n], 7, TYPE_A);
        }
        let mut nx = reply(7, &[]);
        nx[3] = 0x83;
        assert_eq!(decode(&nx, 7, TYPE_A).unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
