//! Security review 2, finding 14 for real (the `bumblehive serve` binary): connections without a token that send nothing or half a request cannot lock the person out; a silent connection is closed by the header timer, which starts at accept.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::WAIT;

struct Serve {
    _child: tokio::process::Child,
    token: String,
    port: u16,
    _dir: tempfile::TempDir,
}

/// `bumblehive serve` on a free port with a config that names no reachable model.
async fn serve() -> Serve {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        json!({"provider": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "x"}})
            .to_string(),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_bumblehive"))
        .arg("--config")
        .arg(dir.path().join("config.json"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["serve", "--port", "0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("the server printed nothing")
        .unwrap()
        .expect("the server closed stdout");
    let hello: Value = serde_json::from_str(&first).unwrap();
    let url = hello["url"].as_str().unwrap().to_string();
    Serve {
        _child: child,
        token: hello["token"].as_str().unwrap().to_string(),
        port: url.rsplit(':').next().unwrap().parse().unwrap(),
        _dir: dir,
    }
}

impl Serve {
    async fn raw(&self) -> tokio::net::TcpStream {
        tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .unwrap()
    }

    /// One authenticated `list_sessions` on a new connection: its status line, or why not,
    /// within `within`.
    async fn authenticated(&self, within: Duration) -> Result<String, String> {
        let request = format!(
            "POST /api/list_sessions HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}",
            self.port, self.token
        );
        let exchange = async {
            let mut stream = self.raw().await;
            stream
                .write_all(request.as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            stream
                .read_to_end(&mut out)
                .await
                .map_err(|e| e.to_string())?;
            Ok(String::from_utf8_lossy(&out)
                .lines()
                .next()
                .unwrap_or("")
                .to_string())
        };
        tokio::time::timeout(within, exchange)
            .await
            .map_err(|_| format!("timed out after {within:?}"))?
    }
}

/// Whether the server has closed `stream` (a read answers end of file or an error).
async fn closed(stream: &mut tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 512];
    loop {
        match tokio::time::timeout(Duration::from_millis(1), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// Finding 14: a connection that sends nothing at all is closed by the server within
/// twice the header timeout (the timer starts at accept, not at the first byte).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_server_closes_a_connection_that_sends_nothing() {
    let server = serve().await;
    let mut silent = server.raw().await;
    let mut preface = server.raw().await;
    preface.write_all(b"PRI * HTTP/2.0").await.unwrap();
    let deadline = bumblehive::server::HEADER_TIMEOUT * 2;
    let mut out = Vec::new();
    let read = tokio::time::timeout(deadline, silent.read_to_end(&mut out)).await;
    assert!(
        read.is_ok(),
        "a silent connection was still open after {deadline:?}"
    );
    let read = tokio::time::timeout(deadline, preface.read_to_end(&mut out)).await;
    assert!(
        read.is_ok(),
        "half an h2 preface was still open after {deadline:?}"
    );
}

/// Finding 14: 300 connections without a token (150 that send nothing, 150 with half a
/// request line) are held open; the person's authenticated request still gets its 200
/// within 5 s, and the server holds at most 64 of the half-open connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_server_answers_the_person_while_300_half_open_connections_are_held() {
    let server = serve().await;
    let mut held = Vec::new();
    for i in 0..300 {
        let mut stream = server.raw().await;
        if i % 2 == 1 {
            stream
                .write_all(b"POST /api/list_sessions HT")
                .await
                .unwrap();
        }
        held.push(stream);
    }
    let started = Instant::now();
    let answer = server.authenticated(Duration::from_secs(5)).await;
    assert_eq!(
        answer.as_deref(),
        Ok("HTTP/1.1 200 OK"),
        "the authenticated request failed after {:?} while 300 half-open connections were held",
        started.elapsed()
    );
    let mut open = 0;
    for stream in &mut held {
        if !closed(stream).await {
            open += 1;
        }
    }
    assert!(
        open <= 64,
        "the server still holds {open} of the 300 half-open connections"
    );
}

/// Finding 14: a request without the token gets its 401 and the connection is closed at
/// once (was: kept alive until the next header timeout, holding a connection slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_server_closes_the_connection_of_a_refused_request() {
    let server = serve().await;
    let mut stream = server.raw().await;
    let request = format!(
        "POST /api/list_sessions HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 2\r\n\r\n{{}}",
        server.port
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 401"), "{text}");
    assert!(read.is_ok(), "the refused connection was kept open: {text}");
}
