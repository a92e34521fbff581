//! A bash command with the proxy as its network, against an origin on the
//! host's loopback reached only through an `allowPrivate` entry.

use std::sync::Arc;
use std::time::Duration;

use pi_python_sandbox::network::addr::own_addresses;
use pi_python_sandbox::network::policy::{parse_private, Lists, YoloReview};
use pi_python_sandbox::network::proxy::Policy;
use pi_python_sandbox::shell::{Command, Ending, ShellConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An HTTP origin on `127.0.0.1` answering `hello-from-origin`.
async fn origin() -> (u16, tokio::task::JoinHandle<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = tokio::time::timeout(Duration::from_secs(2), c.read(&mut buf)).await;
                let body = "hello-from-origin\n";
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                let _ = c.write_all(head.as_bytes()).await;
                let _ = c.write_all(body.as_bytes()).await;
            });
        }
    });
    (port, task)
}

async fn run(f: &super::Fixture, network: Option<Policy>, script: &str) -> (String, Vec<String>) {
    f.session.set_shell_config(ShellConfig { network, ..Default::default() });
    let out = Arc::new(parking_lot::Mutex::new(String::new()));
    let sink = out.clone();
    let on_data = move |t: String| sink.lock().push_str(&t);
    let cmd = Command {
        command: script.into(),
        cwd: f.dir.join("project"),
        shell: None,
        timeout: Some(Duration::from_secs(60)),
        pi_env: vec![],
        reviewing: Default::default(),
    };
    let ended = f.session.exec_shell(1, cmd, &on_data).await.unwrap();
    assert_eq!(ended.ending, Ending::Exited(0), "{}", out.lock());
    let text = out.lock().clone();
    (text, ended.notes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_reaches_an_allowed_origin_through_the_proxy_and_nothing_else() {
    let Some(f) = super::fixture("net-shell") else { return };
    let (port, _origin) = origin().await;
    let policy = Policy {
        lists: Lists { allow_private: vec![parse_private(&format!("127.0.0.1:{port}")).unwrap()], ..Lists::EMPTY },
        own: own_addresses(),
        yolo: false,
        yolo_review: YoloReview::Allow,
        bounds: Default::default(),
    };
    let script = format!(
        "curl -sS --max-time 10 http://127.0.0.1:{port}/; echo \"allowed=$?\"; \
         curl -sS --max-time 10 http://127.0.0.1:1/; echo \"literal=$?\"; \
         curl -sS --max-time 10 http://example.com/; echo \"unreviewed=$?\"; \
         curl -sS --max-time 5 --noproxy '*' http://127.0.0.1:{port}/ 2>/dev/null; echo \"bypass=$?\"; \
         curl -sS --max-time 5 --noproxy '*' http://example.com/ 2>/dev/null; echo \"dns=$?\"; \
         /usr/bin/python3 -c \"import urllib.request as u; print('urllib', u.urlopen('http://127.0.0.1:{port}/').read().decode())\"; \
         /usr/bin/python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3)\" 2>&1 | tail -1"
    );
    let (out, notes) = run(&f, Some(policy), &script).await;
    assert!(out.contains("hello-from-origin\nallowed=0"), "{out}");
    assert!(out.contains("127.0.0.1:1 is an IP address that no allow entry names"), "{out}");
    assert!(out.contains("example.com:80 matches no network.allowedDomains entry and no one can review it"), "{out}");
    // Without the proxy nothing leaves: no route to the host's loopback, no DNS.
    assert!(out.contains("bypass=7"), "{out}");
    assert!(out.contains("dns=6"), "{out}");
    assert!(out.contains("urllib hello-from-origin"), "{out}");
    // A raw connection to the host's loopback reaches the sandbox's own.
    assert!(out.contains("ConnectionRefusedError"), "{out}");
    assert!(notes.iter().any(|n| n == &format!("network: allowed 127.0.0.1:{port}.")), "{notes:?}");
    assert!(notes.iter().any(|n| n.contains("(to allow it: network.allowedDomains \"example.com:80\")")), "{notes:?}");
    // Baseline: without a network the same allowed request cannot even
    // make a socket.
    let (out, _) = run(&f, None, &format!("curl -sS --max-time 5 http://127.0.0.1:{port}/; echo \"none=$?\"")).await;
    assert!(!out.contains("hello-from-origin") && out.contains("none=7"), "{out}");
}
