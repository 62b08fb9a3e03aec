//! An origin that counts its answers, for tests that must tell a page answered before an event
//! (a purge, a POST) from one answered after it.

use super::{Body, OriginResponse, TestOrigin};
use crate::client::{get, Resp};
use crate::cluster::Node;
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

/// Asserts that each of `nodes` answers a GET of `path` (with `headers`) with a `200` other than
/// a [`counting_origin`]'s first answer (`body-1-late`), which is `what`.
pub async fn none_serves_the_first_answer(
    nodes: &[&Node],
    path: &str,
    headers: &[(&str, &str)],
    what: &str,
) {
    for node in nodes {
        let resp = get(&node.proxy.url(path), headers).await;
        assert_eq!(resp.status, 200);
        assert_ne!(
            &resp.body[..],
            b"body-1-late",
            "{} served {what}",
            node.name
        );
    }
}

/// Asserts that each of `nodes` answered (`answers`, in their order) with a [`counting_origin`]'s
/// first answer (`body-1-late`), the fill they waited for, and that `origin` served `path` once:
/// one fetch for the cluster.
pub fn all_served_the_first_answer(
    nodes: &[&Node],
    answers: &[Resp],
    origin: &TestOrigin,
    path: &str,
) {
    for (node, resp) in nodes.iter().zip(answers) {
        assert_eq!(resp.status, 200, "{}", node.name);
        assert_eq!(
            &resp.body[..],
            b"body-1-late",
            "{} fetched for itself",
            node.name
        );
    }
    assert_eq!(
        origin.hits_for(path),
        1,
        "the cluster fetched the slow page more than once"
    );
}
