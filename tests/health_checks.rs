//! Health and failover over real replicas: active checks take a backend out and bring it back,
//! passive checks eject a failing one, and idempotent requests survive a dead or resetting
//! backend through retries, while nothing is retried once the client has bytes.

use lacquer_test_support as support;

use std::time::Duration;
use support::*;

const ACTIVE: &str = "[balancer]\nalgorithm = \"round_robin\"\n\
    [balancer.health_check]\npath = \"/health\"\ninterval = \"200ms\"\ntimeout = \"150ms\"\nrise = 2\nfall = 2\n";

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_check_takes_a_failing_backend_out_and_back_in() {
    let r = [
        Replica::start("a"),
        Replica::start("b"),
        Replica::start("c"),
    ];
    let lb = start_balancer(
        &[(r[0].addr(), 1), (r[1].addr(), 1), (r[2].addr(), 1)],
        ACTIVE,
    );
    r[2].set_health(503);
    let down = format!("backend {} is down", r[2].addr());
    assert!(wait_for_log(&lb, &down, WAIT), "{}", lb.stderr_log());
    let before = r[2].served();
    for i in 0..30 {
        assert_eq!(get(&lb.url(&format!("/out/{i}")), &[]).await.status, 200);
    }
    assert_eq!(
        r[2].served(),
        before,
        "a backend marked down still got traffic"
    );
    assert!(r[0].served() > 0 && r[1].served() > 0);

    r[2].set_health(200);
    let up = format!("backend {} is up", r[2].addr());
    assert!(wait_for_log(&lb, &up, WAIT), "{}", lb.stderr_log());
    for i in 0..30 {
        assert_eq!(get(&lb.url(&format!("/back/{i}")), &[]).await.status, 200);
    }
    assert!(r[2].served() > before, "a recovered backend got no traffic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_killed_mid_test_loses_no_idempotent_request() {
    let [a, b, c] = [
        Replica::start("a"),
        Replica::start("b"),
        Replica::start("c"),
    ];
    let killed = c.addr();
    let lb = start_balancer(&[(a.addr(), 1), (b.addr(), 1), (killed, 1)], ACTIVE);
    let url = lb.url("/steady");
    let run = |tag: &'static str, n: usize| {
        let url = url.clone();
        tokio::spawn(async move {
            let client = http_client();
            let mut failures = Vec::new();
            for i in 0..n {
                let path = format!("{url}/{tag}/{i}?sleep=5");
                match send(&client, "GET", &path, &[], None).await {
                    Ok(r) if r.status == 200 => {}
                    Ok(r) => failures.push(format!("{i}: status {}", r.status)),
                    Err(e) => failures.push(format!("{i}: {e}")),
                }
            }
            failures
        })
    };
    let load = [run("x", 200), run("y", 200)];
    assert!(c.origin.wait_for_hits(5, WAIT), "c never got traffic");
    drop(c); // closes its listener and every connection
    let down = format!("backend {killed} is down");
    assert!(wait_for_log(&lb, &down, WAIT), "{}", lb.stderr_log());
    for worker in load {
        let failures = worker.await.unwrap();
        assert!(
            failures.is_empty(),
            "failed requests: {failures:?}\n{}",
            lb.stderr_log()
        );
    }
    // the load did meet the dead backend, and was retried (Pingora logs each retried failure)
    assert!(
        lb.stderr_log().contains("retry: true"),
        "no retry happened: {}",
        lb.stderr_log()
    );
    // after the verdict, everything goes to the survivors
    let (sa, sb) = (a.served(), b.served());
    for i in 0..20 {
        assert_eq!(get(&lb.url(&format!("/after/{i}")), &[]).await.status, 200);
    }
    assert_eq!(a.served() + b.served(), sa + sb + 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_check_ejects_a_backend_answering_5xx() {
    let r = [Replica::start("a"), Replica::start("b")];
    let failing = TestOrigin::start(|_| OriginResponse::ok("broken").status(502));
    let admin = free_port();
    let lb = start_balancer(
        &[(r[0].addr(), 1), (r[1].addr(), 1), (failing.addr(), 1)],
        &format!(
            "[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
             [balancer]\nalgorithm = \"round_robin\"\n\
             [balancer.passive]\nfailures = 3\nwindow = \"60s\"\ncooldown = \"60s\"\n"
        ),
    );
    let mut bad = 0;
    for i in 0..60 {
        if get(&lb.url(&format!("/p/{i}")), &[]).await.status == 502 {
            bad += 1;
        }
    }
    assert_eq!(failing.hits(), 3, "ejection should follow the third 5xx");
    assert_eq!(bad, 3);
    let ejected = format!("backend {} ejected", failing.addr());
    assert!(lb.stderr_log().contains(&ejected), "{}", lb.stderr_log());

    // /stats shows each backend's state and counters, as the origins saw them
    let stats = get(&format!("http://127.0.0.1:{admin}/stats"), &[])
        .await
        .text();
    let failing_entry = format!(
        "{{\"name\":\"{}\",\"weight\":1,\"up\":true,\"ejected\":true,\"requests\":3,\"failures\":3,\"ejections\":1,",
        failing.addr()
    );
    assert!(stats.contains(&failing_entry), "{stats}");
    for replica in &r {
        let entry = format!(
            "{{\"name\":\"{}\",\"weight\":1,\"up\":true,\"ejected\":false,\"requests\":{},\"failures\":0,\"ejections\":0,",
            replica.addr(),
            replica.served()
        );
        assert!(stats.contains(&entry), "{stats}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failures_are_retried_on_another_backend_for_get_only() {
    let r = [Replica::start("a"), Replica::start("b")];
    let dead = refused_addr();
    let lb = start_balancer(
        &[(r[0].addr(), 1), (r[1].addr(), 1), (dead, 1)],
        "[balancer]\nalgorithm = \"round_robin\"\n[balancer.passive]\nenabled = false\n",
    );
    for i in 0..30 {
        let resp = get(&lb.url(&format!("/g/{i}")), &[]).await;
        assert_eq!(resp.status, 200, "GET {i} was not retried");
    }
    assert_eq!(r[0].served() + r[1].served(), 30);
    let mut refused_posts = 0;
    for i in 0..6 {
        let resp = post(&lb.url(&format!("/post/{i}")), &[], "body").await;
        if resp.status == 502 {
            refused_posts += 1;
        }
    }
    // round robin over three: two of six POSTs meet the dead backend and are not retried
    assert_eq!(refused_posts, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_before_the_response_is_retried() {
    let good = Replica::start("good");
    let closing = RawOrigin::closing();
    let lb = start_balancer(
        &[(good.addr(), 1), (closing.addr, 1)],
        "[balancer]\nalgorithm = \"round_robin\"\n[balancer.passive]\nenabled = false\n",
    );
    for i in 0..10 {
        let resp = get(&lb.url(&format!("/r/{i}")), &[]).await;
        assert_eq!(resp.status, 200);
    }
    assert!(
        closing.accepted() > 0,
        "the closing backend was never tried"
    );
    assert_eq!(good.served(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_retried_after_bytes_reached_the_client() {
    let good = Replica::start("good");
    let truncating = RawOrigin::truncating();
    let lb = start_balancer(
        &[(truncating.addr, 1), (good.addr(), 1)],
        "[balancer]\nalgorithm = \"round_robin\"\n[balancer.passive]\nenabled = false\n",
    );
    // round robin starts with the first backend: the truncating one
    let result = try_get(&lb.url("/partial"), &[]).await;
    // either the client saw the connection cut, or a short body
    if let Ok(resp) = result {
        assert!(
            resp.body.len() < 1000,
            "got a whole body: {}",
            resp.body.len()
        );
    }
    assert_eq!(truncating.accepted(), 1);
    assert_eq!(
        good.served(),
        0,
        "the request was replayed after bytes were sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_byte_timeout_is_retried_on_another_backend() {
    let fast = Replica::start("fast");
    let stuck = Replica::start("stuck");
    stuck.set_delay(10_000);
    let lb = start_balancer(
        &[(stuck.addr(), 1), (fast.addr(), 1)],
        "[balancer]\nalgorithm = \"round_robin\"\n[balancer.passive]\nenabled = false\n\
         [balancer.timeouts]\nfirst_byte = \"1s\"\nidle = \"1s\"\n",
    );
    for i in 0..4 {
        let resp = get(&lb.url(&format!("/t/{i}")), &[]).await;
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header("x-backend").as_deref(), Some("fast"));
    }
    // round robin sent two of the four to the stuck backend first
    assert!(stuck.served() >= 2, "the stuck backend was never tried");
    // a POST is not replayed: it times out on the stuck backend
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for i in 0..2 {
            v.push(post(&lb.url(&format!("/tp/{i}")), &[], "x").await.status);
        }
        v
    };
    assert!(statuses.iter().any(|&s| s >= 500), "{statuses:?}");
}
