//! `weir echo`: a tiny HTTP/1.1 upstream that answers 200 to everything. Something to proxy to in
//! the quick start and in benchmarks, so trying Weir needs nothing else installed.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub fn run(listen: SocketAddr) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(listen).await?;
        tracing::info!(%listen, "echo upstream listening");
        loop {
            let (stream, _) = listener.accept().await?;
            tokio::spawn(serve(stream));
        }
    })
}

async fn serve(mut stream: TcpStream) {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        // Read one request head; bodies are skipped by Content-Length.
        let head_end = loop {
            if let Some(end) = find_head_end(&buf) {
                break end;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if buf.len() > 64 * 1024 {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
        let body_len = content_length(&head);
        while buf.len() < head_end + body_len {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_end + body_len);
        let path = head.split_whitespace().nth(1).unwrap_or("/");
        let body = format!("ok {path}\n");
        let resp =
            format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        if stream.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

fn content_length(head: &str) -> usize {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}
