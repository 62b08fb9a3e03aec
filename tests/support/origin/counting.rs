//! An origin that counts its answers, for tests that must tell a page answered before an event
//! (a purge, a POST) from one answered after it.

use super::{Body, OriginResponse, TestOrigin};
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// An origin whose GETs are answered `body-N-`, then `late` after `pause`, the body ending
/// `pause` later (so it takes twice `pause`), with `cache_control`; N counts the GETs from 1. A
/// POST is answered `changed`.
pub fn counting_origin(pause: Duration, cache_control: &'static str) -> TestOrigin {
    let served = AtomicUsize::new(0);
    TestOrigin::start(move |req| {
        if req.method == "POST" {
            return OriginResponse::ok("changed");
        }
        let n = served.fetch_add(1, Ordering::SeqCst) + 1;
        OriginResponse::ok(Body::Paced {
            chunks: vec![
                Bytes::from(format!("body-{n}-")),
                Bytes::from_static(b"late"),
            ],
            interval: pause,
        })
        .header("cache-control", cache_control)
    })
}
