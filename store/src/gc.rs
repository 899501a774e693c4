//! Collection: the blobs and state manifests of a task that no state of it needs any more.
//!
//! A task's state is the manifest its head names; a manifest names its blobs (checkpoint
//! segments and workspace files, by hash; a segment carried inline in it names none, see
//! [`crate::state`]). When a holder writes a new state, the one it
//! replaced, and the blobs only that one named, become garbage, but not at once: a reader
//! (a kernel taking the task, `flowrepl store show`) may have read the head a moment before
//! and still be fetching the older manifest and its blobs. So a manifest is kept for a
//! **grace period** after it was replaced ([`grace`], `FLOWREPL_STORE_GC_GRACE_S`, default
//! [`DEFAULT_GRACE`]), and a blob is kept while a kept manifest names it or while it is
//! younger than the grace (a holder writes a state's blobs before its manifest). Everything
//! else under `state/` and `blobs/` is removed. Log segments are the task's history and are
//! never collected.
//!
//! Times are the store's modification times. "When a manifest was replaced" is when the next
//! manifest was written (the one that replaced it), and "now" is given by the caller: the
//! holder passes the time of the manifest it just wrote (the store's own clock), `flowrepl
//! store gc` this machine's clock.
//!
//! Who collects: the holder, after a state commit, at most every [`Collector::every`]
//! ([`Collector`]); and `flowrepl store gc` for tasks no one holds, which takes the task's
//! lease for the time it collects ([`crate::admin::gc`]), so that no holder writes meanwhile.

use crate::head::{Head, TaskKeys};
use crate::objects::{Listed, Store, StoreError};
use crate::state::Manifest;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The variable that sets the grace period, in seconds.
pub const GRACE_VARIABLE: &str = "FLOWREPL_STORE_GC_GRACE_S";
/// The grace period when [`GRACE_VARIABLE`] is not set: a replaced manifest, and blobs no
/// kept manifest names, stay this long.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(300);

/// The grace period: [`GRACE_VARIABLE`] if set to a number of seconds, else
/// [`DEFAULT_GRACE`].
pub fn grace() -> Duration {
    std::env::var(GRACE_VARIABLE)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(DEFAULT_GRACE, Duration::from_secs_f64)
}

/// Why a task could not be collected. Nothing is removed then.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GcError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A manifest that is kept could not be read: the blobs it names are unknown, so none is
    /// removed.
    #[error("the manifest {key} cannot be read ({why}); nothing is collected")]
    Manifest {
        /// Its key.
        key: String,
        /// Why.
        why: String,
    },
}

/// What a collection keeps and removes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Manifests kept (the head's, and those replaced less than the grace ago).
    pub kept_manifests: Vec<String>,
    /// Manifests to remove.
    pub removed_manifests: Vec<String>,
    /// Blobs kept: how many, and their bytes.
    pub kept_blobs: (u64, u64),
    /// Blobs to remove (key, bytes).
    pub removed_blobs: Vec<(String, u64)>,
}

impl Plan {
    /// Bytes the removed blobs take.
    pub fn removed_bytes(&self) -> u64 {
        self.removed_blobs.iter().map(|(_, b)| b).sum()
    }
}

fn age(now: DateTime<Utc>, then: DateTime<Utc>) -> Duration {
    (now - then).to_std().unwrap_or(Duration::ZERO)
}

/// The folder of the task's blobs.
fn blobs_folder(keys: &TaskKeys) -> String {
    let key = keys.blob("x");
    key[..key.len() - 1].to_owned()
}

/// The folder of the task's manifests.
fn state_folder(keys: &TaskKeys) -> String {
    let key = keys.state(0, "x", 0);
    let cut = key.rfind('/').map_or(0, |i| i + 1);
    key[..cut].to_owned()
}

/// The sha256 of a blob key (its last part).
fn blob_hash(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or(key)
}

/// Decides what to collect of the task `keys` whose head is `head`, at `now` with `grace`
/// (see the module's rules). Reads the store (lists, and the kept manifests); removes
/// nothing.
pub async fn plan(
    store: &Store,
    keys: &TaskKeys,
    head: &Head,
    now: DateTime<Utc>,
    grace: Duration,
) -> Result<Plan, GcError> {
    plan_at(store, keys, head, |_| now, grace).await
}

/// [`plan`], with "now" taken from the listed manifests.
async fn plan_at(
    store: &Store,
    keys: &TaskKeys,
    head: &Head,
    now: impl FnOnce(&[Listed]) -> DateTime<Utc>,
    grace: Duration,
) -> Result<Plan, GcError> {
    let mut manifests: Vec<Listed> = store.list(&state_folder(keys)).await?;
    manifests.sort_by(|a, b| a.modified.cmp(&b.modified).then(a.key.cmp(&b.key)));
    let now = now(&manifests);
    let mut plan = Plan::default();
    for (i, m) in manifests.iter().enumerate() {
        let current = head.state.as_deref() == Some(m.key.as_str());
        // Replaced when the next one was written; the newest one that is not the head's is a
        // state being written (or a stale holder's): its own age counts.
        let since = manifests
            .get(i + 1)
            .map_or(m.modified, |next| next.modified);
        if current || age(now, since) < grace {
            plan.kept_manifests.push(m.key.clone());
        } else {
            plan.removed_manifests.push(m.key.clone());
        }
    }
    if let Some(state) = &head.state {
        if !plan.kept_manifests.contains(state) {
            // The head names a manifest the listing did not show (just written): keep it.
            plan.kept_manifests.push(state.clone());
        }
    }
    let mut named = BTreeSet::new();
    for key in &plan.kept_manifests {
        let Some((bytes, _)) = store.get(&store.key(key)).await? else {
            // Removed in between (by an older collection): it names nothing any more.
            continue;
        };
        let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| GcError::Manifest {
            key: key.clone(),
            why: e.to_string(),
        })?;
        // Inline segments name no blob; the rest, and the workspace files, do.
        named.extend(manifest.blobs());
    }
    for b in store.list(&blobs_folder(keys)).await? {
        if named.contains(blob_hash(&b.key)) || age(now, b.modified) < grace {
            plan.kept_blobs.0 += 1;
            plan.kept_blobs.1 += b.bytes;
        } else {
            plan.removed_blobs.push((b.key, b.bytes));
        }
    }
    Ok(plan)
}

/// Removes what `plan` says: the manifests first, then the blobs. The hashes of the blobs
/// removed.
pub async fn apply(store: &Store, plan: &Plan) -> Result<Vec<String>, StoreError> {
    for key in &plan.removed_manifests {
        store.remove(&store.key(key)).await?;
    }
    let mut removed = Vec::new();
    for (key, _) in &plan.removed_blobs {
        store.remove(&store.key(key)).await?;
        removed.push(blob_hash(key).to_owned());
    }
    Ok(removed)
}

/// The holder's collection: after a state commit, at most every [`Collector::every`].
#[derive(Debug)]
pub struct Collector {
    grace: Duration,
    every: Duration,
    last: Option<Instant>,
}

impl Default for Collector {
    fn default() -> Self {
        Collector::new(grace())
    }
}

impl Collector {
    /// A collector with `grace`; it runs at most every half of it (between 1 s and 60 s).
    pub fn new(grace: Duration) -> Collector {
        Collector {
            grace,
            every: (grace / 2).clamp(Duration::from_secs(1), Duration::from_secs(60)),
            last: None,
        }
    }

    /// How often it runs at most.
    pub fn every(&self) -> Duration {
        self.every
    }

    /// Collects the task of `keys` (whose head, as this holder just wrote it, is `head`) if
    /// it is time; the blobs removed leave `uploaded` (the holder's set of blobs known to be
    /// in the store), so that a later state uploads them again. Failures are logged, never
    /// returned: collection waits for the next time.
    pub async fn after_state(
        &mut self,
        store: &Store,
        keys: &TaskKeys,
        head: &Head,
        uploaded: &mut BTreeSet<String>,
    ) {
        if self.last.is_some_and(|t| t.elapsed() < self.every) {
            return;
        }
        self.last = Some(Instant::now());
        // Now, by the store's clock: when the manifest just written was written.
        let now = |listed: &[Listed]| {
            listed
                .iter()
                .find(|l| head.state.as_deref() == Some(l.key.as_str()))
                .map_or_else(Utc::now, |l| l.modified)
        };
        let plan = plan_at(store, keys, head, now, self.grace).await;
        match plan {
            Ok(plan) if plan.removed_manifests.is_empty() && plan.removed_blobs.is_empty() => {}
            Ok(plan) => match apply(store, &plan).await {
                Ok(removed) => {
                    for sha in &removed {
                        uploaded.remove(sha);
                    }
                    tracing::info!(
                        manifests = plan.removed_manifests.len(),
                        blobs = removed.len(),
                        bytes = plan.removed_bytes(),
                        "collected the task's unused objects in the store"
                    );
                }
                Err(e) => {
                    // Some may be gone: forget them all, they are uploaded again if needed.
                    for (key, _) in &plan.removed_blobs {
                        uploaded.remove(blob_hash(key));
                    }
                    tracing::warn!(error = %e, "collection in the store failed; tried again later");
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "collection in the store failed; tried again later")
            }
        }
    }
}

/// Sizes of a task's objects, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sizes {
    /// Log segments: count, bytes.
    pub log: (u64, u64),
    /// Manifests: count, bytes.
    pub state: (u64, u64),
    /// Blobs: count, bytes.
    pub blobs: (u64, u64),
    /// Anything else (the head, objects of other formats): count, bytes.
    pub other: (u64, u64),
}

impl Sizes {
    /// Bytes in all.
    pub fn bytes(&self) -> u64 {
        self.log.1 + self.state.1 + self.blobs.1 + self.other.1
    }
}

/// The sizes of every object of the task `keys`.
pub async fn sizes(store: &Store, keys: &TaskKeys) -> Result<(Sizes, Vec<Listed>), StoreError> {
    let base = keys.prefix().as_ref().to_owned();
    let listed = store.list(&base).await?;
    let mut sizes = Sizes::default();
    let mut by_kind: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for l in &listed {
        let rest = l.key.strip_prefix(&format!("{base}/")).unwrap_or(&l.key);
        let kind = match rest.split('/').next() {
            Some("log") if rest.contains('/') => "log",
            Some("state") if rest.contains('/') => "state",
            Some("blobs") if rest.contains('/') => "blobs",
            _ => "other",
        };
        let e = by_kind.entry(kind).or_default();
        e.0 += 1;
        e.1 += l.bytes;
    }
    sizes.log = by_kind.get("log").copied().unwrap_or_default();
    sizes.state = by_kind.get("state").copied().unwrap_or_default();
    sizes.blobs = by_kind.get("blobs").copied().unwrap_or_default();
    sizes.other = by_kind.get("other").copied().unwrap_or_default();
    Ok((sizes, listed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Segment, StoredCheckpoint};
    use bytes::Bytes;

    use crate::test_runtime as rt;

    /// Writes a blob of `size` bytes (content from `n`) and a manifest naming it; the
    /// manifest's key.
    async fn state(store: &Store, keys: &TaskKeys, n: u64, size: usize) -> String {
        let data: Vec<u8> = (0..size).map(|i| (i as u64 * 31 + n) as u8).collect();
        let sha = crate::state::sha256(&data);
        store
            .put_new(&store.key(&keys.blob(&sha)), Bytes::from(data))
            .await
            .unwrap();
        let manifest = Manifest {
            v: 1,
            sandboxed: false,
            checkpoints: [(
                "auto".to_owned(),
                StoredCheckpoint {
                    journal: String::new(),
                    segments: [("s-000001.bin".to_owned(), Segment::blob(sha, size as u64))].into(),
                },
            )]
            .into(),
            workspace: None,
        };
        let key = keys.state(1, "w", n);
        store
            .put_new(
                &store.key(&key),
                Bytes::from(serde_json::to_vec(&manifest).unwrap()),
            )
            .await
            .unwrap();
        key
    }

    fn head_naming(state: &str) -> Head {
        Head {
            v: 2,
            plan_id: "p".into(),
            task_id: "t".into(),
            epoch: 1,
            state: Some(state.to_owned()),
            ..Default::default()
        }
    }

    /// 20 states of 100 kB each: collection leaves the live one (and what the grace covers),
    /// and a reader that read the head before 15 more states were written still fetches its
    /// older state within the grace; with no grace, the same reader fails (the control).
    #[test]
    fn collection_keeps_the_live_state_and_what_a_reader_within_the_grace_needs() {
        for grace in [Duration::from_secs(60), Duration::ZERO] {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
            let keys = TaskKeys::new("p", "t");
            rt().block_on(async {
                let mut reader_head = None;
                let mut last = String::new();
                for n in 1..=20 {
                    last = state(&store, &keys, n, 100_000).await;
                    if n == 5 {
                        reader_head = Some(head_naming(&last));
                    }
                    // Distinct modification times, in order.
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
                let head = head_naming(&last);
                let now = Utc::now();
                let plan = plan(&store, &keys, &head, now, grace).await.unwrap();
                apply(&store, &plan).await.unwrap();
                let (sizes, _) = sizes(&store, &keys).await.unwrap();
                let reader = tempfile::tempdir().unwrap();
                let fetched = crate::fetch::checkpoints(
                    &store,
                    &keys,
                    reader_head.as_ref().unwrap(),
                    &reader.path().join("checkpoints"),
                    &reader.path().join("mark"),
                    false,
                )
                .await;
                // The live state is always whole.
                let live = tempfile::tempdir().unwrap();
                crate::fetch::checkpoints(
                    &store,
                    &keys,
                    &head,
                    &live.path().join("checkpoints"),
                    &live.path().join("mark"),
                    false,
                )
                .await
                .unwrap();
                if grace.is_zero() {
                    assert_eq!(sizes.blobs, (1, 100_000), "{plan:?}");
                    assert_eq!(sizes.state.0, 1);
                    assert!(fetched.is_err(), "the older state survived without a grace");
                } else {
                    assert!(plan.removed_blobs.is_empty(), "{plan:?}");
                    assert_eq!(sizes.blobs.0, 20);
                    fetched.expect("a reader within the grace fetches its older state");
                }
            });
        }
    }

    /// Manifests replaced longer than the grace ago go, and so do the blobs only they named
    /// once those are older than the grace; younger ones stay.
    #[test]
    fn what_outlived_the_grace_goes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
        let keys = TaskKeys::new("p", "t");
        rt().block_on(async {
            let mut keys_written = Vec::new();
            for n in 1..=3 {
                keys_written.push(state(&store, &keys, n, 1000).await);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let head = head_naming(&keys_written[2]);
            // Two seconds later, with a grace of one: only the head's state is needed.
            let later = Utc::now() + chrono::Duration::seconds(2);
            let p = plan(&store, &keys, &head, later, Duration::from_secs(1))
                .await
                .unwrap();
            assert_eq!(p.kept_manifests, [keys_written[2].clone()]);
            assert_eq!(p.removed_manifests.len(), 2);
            assert_eq!(p.removed_blobs.len(), 2);
            assert_eq!(p.kept_blobs, (1, 1000));
            // Now, with the same grace: everything is younger than it.
            let p = plan(&store, &keys, &head, Utc::now(), Duration::from_secs(1))
                .await
                .unwrap();
            assert!(p.removed_manifests.is_empty() && p.removed_blobs.is_empty());
            // The holder's collector forgets the blobs it removed.
            let mut uploaded: BTreeSet<String> = store
                .list(&blobs_folder(&keys))
                .await
                .unwrap()
                .iter()
                .map(|l| blob_hash(&l.key).to_owned())
                .collect();
            let mut c = Collector::new(Duration::ZERO);
            c.after_state(&store, &keys, &head, &mut uploaded).await;
            assert_eq!(uploaded.len(), 1, "{uploaded:?}");
            assert_eq!(store.list(&state_folder(&keys)).await.unwrap().len(), 1);
        });
    }
}
