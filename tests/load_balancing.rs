//! Load balancing over three real origin replicas: how each algorithm spreads requests, that
//! weights and in-flight load are honoured, and that `--upstream` may repeat.
//!
//! Assertions are structural (who got traffic, who got more), never about timings.

use lacquer_test_support as support;

use support::*;

fn three() -> [Replica; 3] {
    [
        Replica::start("a"),
        Replica::start("b"),
        Replica::start("c"),
    ]
}

async fn get_ok(proc: &LacquerProcess, path: &str) -> Resp {
    let resp = get(&proc.url(path), &[]).await;
    assert_eq!(resp.status, 200, "{path}: {}", resp.text());
    resp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_gives_each_equal_backend_the_same_share() {
    let r = three();
    let lb = start_balancer(
        &[(r[0].addr(), 1), (r[1].addr(), 1), (r[2].addr(), 1)],
        "[balancer]\nalgorithm = \"round_robin\"",
    );
    for i in 0..30 {
        get_ok(&lb, &format!("/rr/{i}")).await;
    }
    // sequential requests, no failures: exactly one full rotation per three requests
    assert_eq!([r[0].served(), r[1].served(), r[2].served()], [10, 10, 10]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_weights_three_to_one() {
    let r = three();
    let lb = start_balancer(
        &[(r[0].addr(), 3), (r[1].addr(), 1), (r[2].addr(), 1)],
        "[balancer]\nalgorithm = \"round_robin\"",
    );
    for i in 0..50 {
        get_ok(&lb, &format!("/w/{i}")).await;
    }
    assert_eq!(r[0].served() + r[1].served() + r[2].served(), 50);
    assert!(
        r[0].served() > 2 * r[1].served(),
        "a={} b={}",
        r[0].served(),
        r[1].served()
    );
    assert!(r[1].served() > 0 && r[2].served() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_sends_each_url_to_one_backend_and_spreads_urls() {
    let r = three();
    let lb = start_balancer(
        &[(r[0].addr(), 1), (r[1].addr(), 1), (r[2].addr(), 1)],
        "[balancer]\nalgorithm = \"consistent\"",
    );
    for i in 0..30 {
        let path = format!("/item/{i}");
        let first = get_ok(&lb, &path).await.header("x-backend").unwrap();
        for _ in 0..3 {
            let again = get_ok(&lb, &path).await.header("x-backend").unwrap();
            assert_eq!(first, again, "{path} changed backend");
        }
    }
    for replica in &r {
        assert!(replica.served() > 0, "{} got no URL", replica.id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_loaded_sends_most_traffic_away_from_a_slow_backend() {
    let r = three();
    r[1].set_delay(400);
    let lb = start_balancer(
        &[(r[0].addr(), 1), (r[1].addr(), 1), (r[2].addr(), 1)],
        "[balancer]\nalgorithm = \"least_loaded\"",
    );
    let url = lb.url("/work");
    let workers: Vec<_> = (0..6)
        .map(|w| {
            let url = url.clone();
            tokio::spawn(async move {
                let client = http_client();
                for i in 0..15 {
                    let resp = send(&client, "GET", &format!("{url}/{w}/{i}"), &[], None)
                        .await
                        .expect("request");
                    assert_eq!(resp.status, 200);
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let (fast_a, slow, fast_c) = (r[0].served(), r[1].served(), r[2].served());
    assert_eq!(fast_a + slow + fast_c, 90);
    // round robin would give the slow one exactly a third
    assert!(slow * 3 < 90, "slow backend got {slow} of 90");
    assert!(
        fast_a > slow && fast_c > slow,
        "a={fast_a} b={slow} c={fast_c}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_two_choices_uses_every_backend() {
    let r = three();
    let lb = start_balancer(
        &[(r[0].addr(), 1), (r[1].addr(), 1), (r[2].addr(), 1)],
        "[balancer]\nalgorithm = \"random_two_choices\"",
    );
    for i in 0..60 {
        get_ok(&lb, &format!("/p2c/{i}")).await;
    }
    for replica in &r {
        assert!(replica.served() > 0, "{} got nothing", replica.id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_hits_do_not_reach_any_backend() {
    let r = three();
    let lb = start_balancer(&[(r[0].addr(), 1), (r[1].addr(), 1), (r[2].addr(), 1)], "");
    get_ok(&lb, "/cacheable/one").await;
    for _ in 0..5 {
        assert!(get_ok(&lb, "/cacheable/one").await.is_hit());
    }
    assert_eq!(r[0].served() + r[1].served() + r[2].served(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_upstream_flag_balances_over_each() {
    let r = three();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (a, b) = (r[0].addr().to_string(), r[1].addr().to_string());
    let lb = LacquerProcess::start_args(
        port,
        &["--listen", &listen, "--upstream", &a, "--upstream", &b],
    );
    for i in 0..10 {
        get_ok(&lb, &format!("/flag/{i}")).await;
    }
    assert_eq!((r[0].served(), r[1].served()), (5, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_upstream_flag_still_works() {
    let r = Replica::start("only");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let addr = r.addr().to_string();
    let lb = LacquerProcess::start_args(port, &["--listen", &listen, "--upstream", &addr]);
    assert_eq!(
        get_ok(&lb, "/x").await.header("x-backend").as_deref(),
        Some("only")
    );
}
