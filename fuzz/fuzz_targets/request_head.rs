//! An HTTP/1 request as a client may send it, through the parser Lacquer serves with (the
//! vendored pingora-core's HTTP/1 server session, with its patches: the framing noted once and
//! the head parsed into an uninitialised header array), Lacquer's own checks of the head
//! (`proxy::request_head::check`), and the body as Pingora frames it: no panic, and what the
//! checks admit has a host that cannot run into the key's path (no `/`, `?` or `#`) and a target
//! the key can start with `/`.

#![no_main]

use lacquer::proxy::cache_key::request_host;
use lacquer::proxy::request_head;
use libfuzzer_sys::fuzz_target;
use pingora_core::protocols::http::v1::server::HttpSession;
use std::io::Cursor;

/// Bodies longer than this many reads are not read to the end (a chunked body of tiny chunks
/// could take the whole input).
const MAX_BODY_READS: usize = 256;

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
}

fuzz_target!(|data: &[u8]| {
    RUNTIME.with(|runtime| runtime.block_on(check(data)));
});

async fn check(data: &[u8]) {
    let mut session = HttpSession::new(Box::new(Cursor::new(data.to_vec())));
    match session.read_request().await {
        Ok(Some(_)) => {}
        _ => return,
    }
    let req = session.req_header();
    if request_head::check(req).is_ok() {
        let host = request_host(req);
        assert!(
            !host.bytes().any(|b| matches!(b, b'/' | b'?' | b'#')),
            "admitted a host that runs into the key's path: {host:?}"
        );
        let target = req.raw_path();
        let scheme = target.split(|&b| b == b':').next().unwrap_or_default();
        assert!(
            target.first() == Some(&b'/')
                || target == b"*"
                || scheme.eq_ignore_ascii_case(b"http")
                || scheme.eq_ignore_ascii_case(b"https"),
            "admitted a target that is neither origin-form, '*' nor http(s) absolute-form: {:?}",
            String::from_utf8_lossy(target)
        );
    }
    for _ in 0..MAX_BODY_READS {
        match session.read_body_bytes().await {
            Ok(Some(_)) => {}
            _ => break,
        }
    }
}
