//! The four ways to choose a backend among the candidates (available, not yet tried).
//!
//! Each function takes the candidates and returns the chosen one's position in that slice, or
//! `None` when there are none. Weights are honoured by every algorithm.

use super::backend::Backend;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Smooth weighted round robin (nginx's): over a round, each backend is chosen `weight` times,
/// interleaved rather than in bursts. The state is one running score per backend of the pool.
#[derive(Debug)]
pub struct RoundRobin {
    current: Mutex<Vec<i64>>,
}

impl RoundRobin {
    /// State for a pool of `size` backends.
    pub fn new(size: usize) -> Self {
        RoundRobin {
            current: Mutex::new(vec![0; size]),
        }
    }

    /// Picks among `candidates`, given as indices into the pool with the pool itself.
    pub fn pick(&self, pool: &[Arc<Backend>], candidates: &[usize]) -> Option<usize> {
        if candidates.is_empty() {
            return None;
        }
        let mut current = self.current.lock().expect("round robin lock");
        let total: i64 = candidates.iter().map(|&i| pool[i].weight as i64).sum();
        let mut best: Option<usize> = None;
        for (pos, &i) in candidates.iter().enumerate() {
            current[i] += pool[i].weight as i64;
            if best.is_none_or(|b| current[i] > current[candidates[b]]) {
                best = Some(pos);
            }
        }
        let chosen = best?;
        current[candidates[chosen]] -= total;
        Some(chosen)
    }
}

/// Fewest requests in flight; ties go to the higher weight, then rotate (by `turn`) so that
/// an idle pool is not all sent to the first backend.
pub fn least_loaded(pool: &[Arc<Backend>], candidates: &[usize], turn: u64) -> Option<usize> {
    let n = candidates.len();
    if n == 0 {
        return None;
    }
    let start = (turn % n as u64) as usize;
    let mut best = start;
    for step in 1..n {
        let pos = (start + step) % n;
        let (a, b) = (&pool[candidates[pos]], &pool[candidates[best]]);
        if (a.in_flight(), std::cmp::Reverse(a.weight))
            < (b.in_flight(), std::cmp::Reverse(b.weight))
        {
            best = pos;
        }
    }
    Some(best)
}

/// Weighted rendezvous hashing of `key`: every backend scores the key, the highest wins. A key
/// keeps its backend as long as that backend is a candidate, and when it is not, only its keys
/// move (each to its own second choice), so the other backends' caches stay warm. A backend is
/// scored by its address, so the replicas of one name differ and a name that gains or loses an
/// address moves only that address's keys.
pub fn consistent(pool: &[Arc<Backend>], candidates: &[usize], key: &[u8]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (pos, &i) in candidates.iter().enumerate() {
        let h = hash2(key, pool[i].address.as_bytes());
        // a uniform value in (0, 1), then the weighted score -w / ln(u)
        let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let score = -(pool[i].weight as f64) / u.ln();
        if best.is_none_or(|(_, s)| score > s) {
            best = Some((pos, score));
        }
    }
    best.map(|(pos, _)| pos)
}

/// Power of two choices: two distinct candidates drawn by weight, the one with fewer requests
/// in flight wins (ties to the higher weight, then the first drawn).
pub fn random_two_choices(pool: &[Arc<Backend>], candidates: &[usize], rng: &Rng) -> Option<usize> {
    match candidates.len() {
        0 => None,
        1 => Some(0),
        _ => {
            let first = weighted_draw(pool, candidates, None, rng);
            let second = weighted_draw(pool, candidates, Some(first), rng);
            let (a, b) = (&pool[candidates[first]], &pool[candidates[second]]);
            let key = |x: &Backend| (x.in_flight(), std::cmp::Reverse(x.weight));
            Some(if key(b) < key(a) { second } else { first })
        }
    }
}

fn weighted_draw(
    pool: &[Arc<Backend>],
    candidates: &[usize],
    except: Option<usize>,
    rng: &Rng,
) -> usize {
    let weight = |pos: usize| {
        if Some(pos) == except {
            0
        } else {
            pool[candidates[pos]].weight as u64
        }
    };
    let total: u64 = (0..candidates.len()).map(weight).sum();
    let mut point = rng.next() % total.max(1);
    for pos in 0..candidates.len() {
        let w = weight(pos);
        if point < w {
            return pos;
        }
        point -= w;
    }
    candidates.len() - 1
}

/// A small lock-free pseudo-random generator (splitmix64); good enough to spread load, and
/// avoids a dependency.
#[derive(Debug)]
pub struct Rng(AtomicU64);

impl Rng {
    /// Seeded from the clock.
    pub fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9);
        Rng(AtomicU64::new(seed))
    }

    /// The next value.
    pub fn next(&self) -> u64 {
        let x = self
            .0
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(x)
    }
}

impl Default for Rng {
    fn default() -> Self {
        Rng::new()
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a over both inputs, then mixed: stable across processes and restarts, so every
/// Lacquer node maps a URL to the same backend.
fn hash2(a: &[u8], b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in a.iter().chain([0u8].iter()).chain(b.iter()) {
        h ^= byte as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::balancing::BackendConfig;
    use crate::upstream::backend::InFlight;

    fn pool(weights: &[u32]) -> Vec<Arc<Backend>> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| {
                let addr = format!("127.0.0.1:{}", 9000 + i).parse().unwrap();
                let config = BackendConfig {
                    name: format!("127.0.0.1:{}", 9000 + i),
                    address: crate::config::origin_address::OriginAddress::Literal(addr),
                    weight: w,
                    group: None,
                    max_in_flight: None,
                    tls: None,
                };
                Arc::new(Backend::new(&config, addr, i))
            })
            .collect()
    }

    #[test]
    fn round_robin_follows_weights_within_each_round() {
        let p = pool(&[3, 1]);
        let rr = RoundRobin::new(2);
        let mut counts = [0; 2];
        for _ in 0..8 {
            counts[rr.pick(&p, &[0, 1]).unwrap()] += 1;
        }
        assert_eq!(counts, [6, 2]);
    }

    #[test]
    fn least_loaded_avoids_busy_backends_and_rotates_ties() {
        let p = pool(&[1, 1, 1]);
        let _busy = InFlight::start(p[0].clone());
        let chosen: Vec<_> = (0..4)
            .map(|t| least_loaded(&p, &[0, 1, 2], t).unwrap())
            .collect();
        assert!(!chosen.contains(&0), "{chosen:?}");
        assert!(chosen.contains(&1) && chosen.contains(&2), "{chosen:?}");
    }

    #[test]
    fn consistent_keeps_keys_on_their_backend_and_moves_only_the_lost_ones() {
        let p = pool(&[1, 1, 1]);
        let keys: Vec<String> = (0..300).map(|i| format!("host/path/{i}")).collect();
        let all: Vec<usize> = keys
            .iter()
            .map(|k| consistent(&p, &[0, 1, 2], k.as_bytes()).unwrap())
            .collect();
        for b in 0..3 {
            assert!(
                all.iter().filter(|&&x| x == b).count() > 50,
                "spread {all:?}"
            );
        }
        // without backend 2, keys that were on 0 or 1 stay there
        for (k, &before) in keys.iter().zip(&all) {
            let after = [0, 1][consistent(&p, &[0, 1], k.as_bytes()).unwrap()];
            if before != 2 {
                assert_eq!(before, after, "{k} moved");
            }
        }
    }

    #[test]
    fn two_choices_never_picks_the_busier_of_two() {
        let p = pool(&[1, 1]);
        let _busy = InFlight::start(p[1].clone());
        let rng = Rng::new();
        for _ in 0..50 {
            assert_eq!(random_two_choices(&p, &[0, 1], &rng), Some(0));
        }
    }
}
