//! A backend's `max_in_flight` with its bounded queue (issue 12 item 4): a serial replica never
//! sees two requests at once; a request that finds the queue full, or waits longer than
//! `balancer.queue.timeout`, is answered 503 without reaching the origin.

use lacquer_test_support as support;
use support::*;

use std::sync::{Arc, Condvar, Mutex};

/// An origin whose `/hold` requests wait until [`Gate::open`] is called.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn wait(&self) {
        let (open, changed) = &*self.0;
        let mut open = open.lock().unwrap();
        while !*open {
            open = changed.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }
}

fn gated_origin(gate: &Gate) -> TestOrigin {
    let gate = gate.clone();
    TestOrigin::start(move |req| {
        if req.path_only() == "/hold" {
            gate.wait();
        }
        OriginResponse::ok("done").header("cache-control", "no-store")
    })
}

/// Lacquer in front of `origin` with `max_in_flight = 1`, the queue as given, an admin port.
fn serial_backend(origin: &TestOrigin, admin: u16, queue: &str) -> LacquerProcess {
    LacquerProcess::start_on_free_port(|port| {
        format!(
            "listen = [\"127.0.0.1:{port}\"]\nthreads = 2\n\
             [[upstreams]]\naddress = \"{}\"\nmax_in_flight = 1\n\
             [admin]\nlisten = \"127.0.0.1:{admin}\"\n[log]\naccess = \"off\"\n\
             [balancer.retries]\nattempts = 0\n[balancer.queue]\n{queue}\n",
            origin.addr()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_serial_replica_never_sees_two_requests_at_once() {
    let replica = Replica::start("serial");
    let lacquer = LacquerProcess::start_on_free_port(|port| {
        format!(
            "listen = [\"127.0.0.1:{port}\"]\nthreads = 2\n\
             [[upstreams]]\naddress = \"{}\"\nmax_in_flight = 1\n[log]\naccess = \"off\"\n",
            replica.addr()
        )
    });
    let requests: Vec<_> = (0..6)
        .map(|i| {
            let url = lacquer.url(&format!("/p/{i}?sleep=100"));
            tokio::spawn(async move { get(&url, &[]).await.status })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.unwrap(), 200);
    }
    assert_eq!(replica.served(), 6);
    assert_eq!(replica.max_in_flight(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_answers_503_and_the_queued_request_goes_next() {
    let gate = Gate::default();
    let origin = gated_origin(&gate);
    let admin = free_port();
    let lacquer = serial_backend(&origin, admin, "length = 1\ntimeout = \"60s\"");

    let holding = tokio::spawn(get_status(lacquer.url("/hold")));
    assert!(
        origin
            .wait_for_hits_for_async("/hold", 1, Duration::from_secs(10))
            .await
    );
    let queued = tokio::spawn(get_status(lacquer.url("/queued")));
    assert_eq!(
        wait_for_stat(admin, "queued", 1, Duration::from_secs(10)).await,
        1,
        "the second request waits in the queue"
    );

    assert_eq!(get_status(lacquer.url("/overflow")).await, 503);
    assert_eq!(origin.hits_for("/overflow"), 0);
    assert_eq!(
        origin.hits_for("/queued"),
        0,
        "not while /hold is in flight"
    );

    gate.open();
    assert_eq!(holding.await.unwrap(), 200);
    assert_eq!(queued.await.unwrap(), 200);
    assert_eq!(origin.hits_for("/queued"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_waiting_past_the_queue_timeout_gets_503() {
    let gate = Gate::default();
    let origin = gated_origin(&gate);
    let admin = free_port();
    let lacquer = serial_backend(&origin, admin, "length = 4\ntimeout = \"200ms\"");

    let holding = tokio::spawn(get_status(lacquer.url("/hold")));
    assert!(
        origin
            .wait_for_hits_for_async("/hold", 1, Duration::from_secs(10))
            .await
    );
    // the gate stays shut until this answer: the wait can only end by the queue timeout
    assert_eq!(get_status(lacquer.url("/late")).await, 503);
    assert_eq!(origin.hits_for("/late"), 0);
    assert_eq!(admin_stat(admin, "queued").await, 0);
    gate.open();
    assert_eq!(holding.await.unwrap(), 200);
}

async fn get_status(url: String) -> u16 {
    get(&url, &[]).await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn balancer_max_in_flight_limits_the_single_upstream() {
    let replica = Replica::start("serial");
    // the one-origin form has no entry to carry max_in_flight: [balancer] gives every backend
    // without its own this limit
    let lacquer = LacquerProcess::start_simple(
        replica.addr(),
        "[log]\naccess = \"off\"\n[balancer]\nmax_in_flight = 1\n",
    );
    let requests: Vec<_> = (0..6)
        .map(|i| {
            let url = lacquer.url(&format!("/p/{i}?sleep=100"));
            tokio::spawn(async move { get(&url, &[]).await.status })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.unwrap(), 200);
    }
    assert_eq!(replica.served(), 6);
    assert_eq!(replica.max_in_flight(), 1);
}
