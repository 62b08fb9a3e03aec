//! Attacks on the take-over of a stray fill lease by swap (`FillLeases::take_over`: a request
//! that waited out a lease whole and finds the very same lease again swaps it in place for its
//! own claim by the CAS token read with it) and on the last claim of a request whose waits are
//! used up (`AfterSharedMiss::UnderAnotherClaim`).
//!
//! Each test plants a stray lease (a value naming a claim nobody holds, as a claim landing
//! after its fill ended leaves) straight into memcached, then sends a GET through a node that
//! waits it out and takes it over.

use lacquer_test_support as support;

use support::lease_rig::*;
use support::*;

/// The page as a GET's `n`th arrival at the origin finds it.
fn page(n: usize) -> OriginResponse {
    OriginResponse::ok(format!("body-{n}")).header("cache-control", "max-age=3600")
}

/// A lease value as a claim of another process makes it (`{ms} {holder:016x}`), claimed now.
fn stray_lease() -> Vec<u8> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!("{now_ms} 00000000deadbeef").into_bytes()
}

/// A stray lease of `/cut` (planted, naming a holder nobody has) is waited out by B, found again
/// and taken over: B reads it with its token and swaps it for its own claim (`cas`). The relay
/// carries the swap out but cuts B's connection before the reply: B's memcached client retries
/// the swap on a fresh connection (a `cas` is retried as a set is), which answers "changed"
/// (the swap landed, or the token is not sent over a connection opened after it was read). B
/// reads the lease again and finds its own claim's value there: it is B's lease. Before the fix
/// B took it for another claim's, waited on it a whole lease more (as did every other node),
/// then, finding it still there, fetched "under another claim" and refused its own fill: a
/// lease B held, renewed by no one, guarded a fill nobody kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_take_over_whose_swap_reply_is_lost_holds_the_lease_it_swapped_in() {
    let server = MemcachedProcess::start();
    let path = "/cut";
    let origin = GatedOrigin::answering(|_, n| page(n));
    let relay = Relay::with(server.addr(), renewal_of(path), Tamper::Cut).await;
    let nodes = Nodes::new(&origin.origin, "local_ttl = \"30s\"\nfill_lease = \"1s\"");
    let b = nodes.start("B", relay.addr);
    // warm B's pool so the swap goes over a pooled connection, as it does in service
    assert_eq!(get(&b.proxy.url("/warm"), &SITE).await.status, 200);
    server.set_raw(&lease_key(path), &stray_lease(), 60);
    let answered = get(&b.proxy.url(path), &SITE).await;
    assert_eq!(&answered.body[..], b"body-1");
    assert!(relay.rules_used(), "B's take-over sent no swap");
    writes_settled(&b).await;
    assert_eq!(origin.hits_for(path), 1);
    assert_eq!(
        admin_stat(b.admin, "fills_under_another_claim").await,
        0,
        "B refused its own fill as fetched under another claim (its own swapped-in lease): {:?}",
        answered.cache_status()
    );
    assert!(
        entry_holds(&server, path, b"body-1"),
        "B's fill under the lease it took over was not written to memcached"
    );
    lease_released(&server, path, "B's taken-over lease was left behind").await;
}
