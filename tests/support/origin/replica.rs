//! Origin replicas for the load-balancing, health-check and fairness tests: real servers on
//! real sockets, each naming itself in `x-backend`, counting what it served and how many
//! requests it had in flight at once, with a switchable `/health` answer.

use super::{query_param, OriginResponse, TestOrigin};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Live counters of one replica, shared with its handler.
#[derive(Debug, Default)]
pub struct ReplicaState {
    /// Status `/health` answers with.
    pub health_status: AtomicU16,
    /// Requests other than `/health` received.
    pub served: AtomicUsize,
    in_flight: AtomicUsize,
    /// Most requests (other than `/health`) this replica ever had in progress at once.
    pub max_in_flight: AtomicUsize,
    /// Extra time every request takes, in milliseconds.
    pub delay_ms: AtomicU64,
}

/// One origin replica.
pub struct Replica {
    /// The name it answers with in `x-backend`.
    pub id: String,
    /// The server itself, for its request log.
    pub origin: TestOrigin,
    /// Its counters and switches, shared with its handler.
    pub state: Arc<ReplicaState>,
}

impl Replica {
    /// Starts replica `id`. Responses are `no-store` (so every request goes upstream) unless
    /// the path starts with `/cacheable`. `?sleep=MS` (or [`set_delay`](Self::set_delay))
    /// holds the request that long, counted in flight.
    pub fn start(id: &str) -> Replica {
        Replica::start_on(id, SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// [`Self::start`] listening on `bind` (see [`TestOrigin::start_on`]).
    pub fn start_on(id: &str, bind: SocketAddr) -> Replica {
        let state = Arc::new(ReplicaState::default());
        state.health_status.store(200, Ordering::SeqCst);
        let handler_state = state.clone();
        let name = id.to_string();
        let origin = TestOrigin::start_on(bind, move |req| {
            let s = &handler_state;
            if req.path_only() == "/health" {
                let status = s.health_status.load(Ordering::SeqCst);
                return OriginResponse::ok("health").status(status);
            }
            s.served.fetch_add(1, Ordering::SeqCst);
            let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            s.max_in_flight.fetch_max(now, Ordering::SeqCst);
            let sleep = query_param(req, "sleep")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                + s.delay_ms.load(Ordering::SeqCst);
            if sleep > 0 {
                std::thread::sleep(Duration::from_millis(sleep));
            }
            s.in_flight.fetch_sub(1, Ordering::SeqCst);
            let cc = if req.path_only().starts_with("/cacheable") {
                "max-age=300"
            } else {
                "no-store"
            };
            OriginResponse::ok(format!("{} from {name}", req.path))
                .header("x-backend", name.clone())
                .header("cache-control", cc)
        });
        Replica {
            id: id.to_string(),
            origin,
            state,
        }
    }

    /// Where it listens, for the balancer's `[[upstreams]]`.
    pub fn addr(&self) -> SocketAddr {
        self.origin.addr()
    }

    /// Requests other than `/health` it received: the share the balancer gave it.
    pub fn served(&self) -> usize {
        self.state.served.load(Ordering::SeqCst)
    }

    /// Most requests (other than `/health`) it had in progress at once.
    pub fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }

    /// Sets the status `/health` answers with, to fail or recover an active check.
    pub fn set_health(&self, status: u16) {
        self.state.health_status.store(status, Ordering::SeqCst);
    }

    /// Makes every request take `ms` longer: a slow backend.
    pub fn set_delay(&self, ms: u64) {
        self.state.delay_ms.store(ms, Ordering::SeqCst);
    }
}
