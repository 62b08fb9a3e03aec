//! The answer to a purge or ban: what it touched and what it could and could not reach, as JSON
//! for the admin API, as one header for a PURGE, and as one log line.

use super::target::Target;
use lacquer_memcached::DeleteOutcome;
use serde::Serialize;

/// What one purge or ban did.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `{issuing instance}-{sequence}`, as it appears in every node's log.
    pub id: String,
    /// `purge` (a URL) or `ban` (a tag, a host, a path prefix).
    pub action: &'static str,
    /// Marked stale rather than removed.
    pub soft: bool,
    pub target: Target,
    pub asked_by: String,
    /// What it did on the node that was asked.
    pub this_node: ThisNode,
    /// What it reached in memcached; `null` without a shared tier.
    pub memcached: Option<MemcachedReport>,
    /// The other nodes that confirmed they have it (when the caller waited for them).
    pub nodes: Option<NodesReport>,
    /// What could not be done yet and is retried in the background until it is (or until the
    /// purge no longer matters): publications to servers that did not answer, a delete on the
    /// server holding the URL.
    pub pending: Vec<String>,
    /// Everything was reached: nothing is pending, and every node waited for confirmed.
    pub complete: bool,
}

/// The node that was asked.
#[derive(Debug, Clone, Serialize)]
pub struct ThisNode {
    pub name: String,
    /// Objects removed (or marked stale) from this node's memory tier.
    pub objects: usize,
    /// Other variants of a URL removed (or marked stale).
    pub variants: usize,
}

/// What a purge or ban reached in memcached.
#[derive(Debug, Clone, Serialize)]
pub struct MemcachedReport {
    /// Servers configured.
    pub servers: usize,
    /// Servers whose copy of the invalidation log has it: every node reading any of them
    /// applies it within the poll interval.
    pub published_to: Vec<String>,
    pub not_published_to: Vec<String>,
    /// The delete of the URL's entry (a hard purge of a URL only).
    pub delete: Option<DeleteReport>,
}

/// The delete of a URL's entry on the server that holds it.
#[derive(Debug, Clone, Serialize)]
pub struct DeleteReport {
    pub server: Option<String>,
    /// `deleted`, `not_found`, `skipped_ejected` or `failed`.
    pub outcome: &'static str,
}

impl DeleteReport {
    /// The report of a delete on `server` that ended in `outcome`.
    pub fn new(server: Option<String>, outcome: DeleteOutcome) -> DeleteReport {
        let outcome = match outcome {
            DeleteOutcome::Deleted => "deleted",
            DeleteOutcome::NotFound => "not_found",
            DeleteOutcome::Skipped => "skipped_ejected",
            DeleteOutcome::Failed => "failed",
        };
        DeleteReport { server, outcome }
    }

    /// Whether the server answered (the delete need not be retried).
    pub fn answered(&self) -> bool {
        matches!(self.outcome, "deleted" | "not_found")
    }
}

/// The other nodes, as far as their heartbeats tell.
#[derive(Debug, Clone, Serialize)]
pub struct NodesReport {
    /// Nodes that applied it.
    pub reached: Vec<String>,
    /// Nodes alive (their heartbeat has not expired) that had not applied it when the wait
    /// ended: they will when they next read the log.
    pub not_confirmed: Vec<String>,
}

impl Report {
    /// Whether anything was found to remove: here, or the URL's entry in memcached.
    pub fn found(&self) -> bool {
        self.this_node.objects + self.this_node.variants > 0
            || self
                .memcached
                .as_ref()
                .and_then(|m| m.delete.as_ref())
                .is_some_and(|d| d.outcome == "deleted")
    }

    /// The HTTP status of the answer: 200 when everything was reached; 202 when some of it is
    /// pending but the log has it (every node will apply it); 503 when no memcached server took
    /// it (only this node has it; publication is retried).
    pub fn status(&self) -> u16 {
        match &self.memcached {
            Some(m) if m.published_to.is_empty() => 503,
            _ if !self.complete => 202,
            _ => 200,
        }
    }

    /// One line for logs and the PURGE answer's `Lacquer-Purge` field:
    /// `here=1+2; memcached=deleted; published=3/3; nodes=1/1; pending=none`.
    pub fn summary(&self) -> String {
        let mut parts = vec![format!(
            "here={}+{}",
            self.this_node.objects, self.this_node.variants
        )];
        if let Some(m) = &self.memcached {
            if let Some(delete) = &m.delete {
                parts.push(format!("memcached={}", delete.outcome));
            }
            parts.push(format!("published={}/{}", m.published_to.len(), m.servers));
        }
        if let Some(n) = &self.nodes {
            let live = n.reached.len() + n.not_confirmed.len();
            parts.push(format!("nodes={}/{live}", n.reached.len()));
        }
        let pending = if self.pending.is_empty() {
            "none".to_string()
        } else {
            self.pending.join(", ")
        };
        parts.push(format!("pending={pending}"));
        parts.join("; ")
    }

    /// The JSON answer: one object and a newline.
    pub fn to_json(&self) -> String {
        let mut body = serde_json::to_string(self).expect("reports serialize to JSON");
        body.push('\n');
        body
    }
}
