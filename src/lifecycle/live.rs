//! The settings every request reads, replaceable while the server runs.
//!
//! Everything the proxy derives from the configuration and may change on a reload lives in one
//! [`LiveSettings`] value: the validated [`Config`], the cache policy, the `Via` entries, the
//! upstream pool's choices (around the same backends), the fairness cap and the compiled request
//! rules. [`Live`] holds it in an [`ArcSwap`]: a phase loads it with one atomic read and no lock,
//! a reload stores a new one. A request that goes past the fast path keeps the value it started
//! with ([`Live::as_held`]), so that every later phase of it (the answer's head, the body
//! filters, the retries) reads the same settings: what its request phase decided is often an
//! index into them (a rule's response edits) and must not be read against another file's. The
//! memory tier, the memcached cluster and the listeners are not here: they outlive reloads.

use crate::config::Config;
use crate::policy::CachePolicy;
use crate::proxy::headers::{ForUsOnly, ViaValues};
use crate::rules::RequestRules;
use crate::upstream::fairness::Fairness;
use crate::upstream::Upstream;
use arc_swap::{ArcSwap, Guard};
use std::ops::Deref;
use std::sync::Arc;

/// What a request reads from the configuration, built once per (re)load.
pub struct LiveSettings {
    /// The configuration these settings were built from (restart-only keys as running).
    pub config: Arc<Config>,
    /// Storability and freshness (`[cache]`).
    pub policy: CachePolicy,
    /// Our `Via` entries, rendered once (`proxy.via_name`).
    pub via: ViaValues,
    /// Fields removed from every response to a client (`cache.strip_targeted_fields`, the tag
    /// header unless `invalidation.forward_tag_header`).
    pub for_us_only: ForUsOnly,
    /// The origin pool: the same backends (and their live state) for the process's life, the
    /// algorithm, retries and timeouts as configured now.
    pub upstream: Upstream,
    /// The per-client cap on requests going upstream, if configured.
    pub fairness: Option<Fairness>,
    /// `[[rules]]`, compiled (their regexes into sets) once per (re)load.
    pub rules: RequestRules,
}

impl LiveSettings {
    /// The settings at start-up: a fresh upstream pool.
    pub fn initial(config: Config) -> Self {
        let upstream = Upstream::new(&config);
        let fairness = config.fairness.clone().map(Fairness::new);
        LiveSettings::build(Arc::new(config), upstream, fairness)
    }

    /// The settings after a reload: the running backends with the new choices; the fairness
    /// slots carried over unless `[fairness]` changed (new slots then start empty).
    pub fn reloaded(running: &LiveSettings, config: Config) -> Self {
        let upstream = running.upstream.reconfigured(&config);
        let fairness = if config.fairness == running.config.fairness {
            running.fairness.clone()
        } else {
            config.fairness.clone().map(Fairness::new)
        };
        LiveSettings::build(Arc::new(config), upstream, fairness)
    }

    fn build(config: Arc<Config>, upstream: Upstream, fairness: Option<Fairness>) -> Self {
        let tag_header = config
            .invalidation
            .tag_header
            .as_deref()
            .filter(|_| !config.invalidation.forward_tag_header);
        let for_us_only = ForUsOnly::new(
            config
                .cache
                .strip_targeted_fields
                .iter()
                .map(String::as_str)
                .chain(tag_header),
        );
        LiveSettings {
            for_us_only,
            policy: CachePolicy::new(&config.cache),
            via: ViaValues::new(&config.proxy.via_name)
                .expect("proxy.via_name is checked to be an HTTP token when the config is loaded"),
            rules: RequestRules::new(&config.rules),
            upstream,
            fairness,
            config,
        }
    }
}

/// The current [`LiveSettings`], swapped whole by a reload.
pub struct Live(ArcSwap<LiveSettings>);

impl Live {
    /// Holds the start-up settings.
    pub fn new(settings: LiveSettings) -> Self {
        Live(ArcSwap::from_pointee(settings))
    }

    /// The current settings, for one phase of one request: an atomic load, no reference count
    /// on the hit path.
    pub fn load(&self) -> Guard<Arc<LiveSettings>> {
        self.0.load()
    }

    /// The current settings, kept (a reload building on them).
    pub fn load_full(&self) -> Arc<LiveSettings> {
        self.0.load_full()
    }

    /// The settings a request started with, `held` (none: it keeps none, and reads the current
    /// ones). While no reload has replaced them they are the current ones, loaded as [`Self::load`]
    /// does; the request's own reference is only cloned after a reload, so the usual phase
    /// touches no reference count shared by every request.
    pub fn as_held(&self, held: Option<&Arc<LiveSettings>>) -> Settings {
        let current = self.0.load();
        match held {
            Some(held) if !Arc::ptr_eq(held, &current) => Settings::Held(Arc::clone(held)),
            _ => Settings::Current(current),
        }
    }

    /// Replaces the settings; requests already past the fast path finish with the ones they
    /// started with.
    pub fn store(&self, settings: LiveSettings) {
        self.0.store(Arc::new(settings));
    }
}

/// One phase's view of a request's settings ([`Live::as_held`]): the current ones, or the ones
/// it started with when a reload has replaced them since.
pub enum Settings {
    /// No reload since the request started (or it keeps none).
    Current(Guard<Arc<LiveSettings>>),
    /// Replaced by a reload while the request ran.
    Held(Arc<LiveSettings>),
}

impl Deref for Settings {
    type Target = LiveSettings;

    fn deref(&self) -> &LiveSettings {
        match self {
            Settings::Current(guard) => guard,
            Settings::Held(held) => held,
        }
    }
}
