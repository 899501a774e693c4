//! The operator's view of a store (`flowrepl store ls|show|release|gc`): the tasks, their
//! holders and sizes; one task's head, log segments, states and blobs; releasing a task whose
//! holder is known dead; collecting tasks no one holds ([`crate::gc`]).

use crate::gc::{self, Plan, Sizes};
use crate::head::{now, Head, Holder, TaskKeys};
use crate::objects::{Listed, Store, StoreError, Swapped};
use crate::state::Manifest;
use bytes::Bytes;
use object_store::UpdateVersion;
use std::time::{Duration, Instant};

/// Why an operator's command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store has no such task.
    #[error("the store has no task {plan}/{task} (no head object)")]
    NoTask {
        /// The plan.
        plan: String,
        /// The task.
        task: String,
    },
    /// The head does not parse.
    #[error("the head {key} cannot be read: {why}")]
    BadHead {
        /// Its key.
        key: String,
        /// Why.
        why: String,
    },
    /// The holder renewed its lease while the command watched: it is alive.
    #[error("task {plan}/{task} is held by {holder} (epoch {epoch}), which renewed its lease while this command watched: it is alive, so it was not released; `--force` takes the task from it anyway (that kernel is fenced at its next write to the store and stops; calls it answers meanwhile are not in the store)")]
    Live {
        /// The plan.
        plan: String,
        /// The task.
        task: String,
        /// The holder.
        holder: Box<Holder>,
        /// Its epoch.
        epoch: u64,
    },
    /// The head kept changing under the command.
    #[error("the head of {plan}/{task} kept changing while this command swapped it; try again")]
    Busy {
        /// The plan.
        plan: String,
        /// The task.
        task: String,
    },
    /// The epoch cannot be bumped any more.
    #[error("the epoch of {plan}/{task} is at its largest value; the task cannot be taken again")]
    EpochExhausted {
        /// The plan.
        plan: String,
        /// The task.
        task: String,
    },
    /// Collection failed.
    #[error(transparent)]
    Gc(#[from] gc::GcError),
}

fn parse(key: &str, bytes: &[u8]) -> Result<Head, AdminError> {
    serde_json::from_slice(bytes).map_err(|e| AdminError::BadHead {
        key: key.to_owned(),
        why: e.to_string(),
    })
}

/// The task's head and its version, `None` when it has none.
pub async fn read_head(
    store: &Store,
    keys: &TaskKeys,
) -> Result<Option<(Head, UpdateVersion)>, AdminError> {
    let key = keys.head();
    match store.get(&store.key(&key)).await? {
        Some((bytes, version)) => Ok(Some((parse(&key, &bytes)?, version))),
        None => Ok(None),
    }
}

/// One task, as `store ls` lists it.
#[derive(Debug, Clone)]
pub struct TaskSummary {
    /// Its folder's names (`tasks/<plan>/<task>`).
    pub folder: (String, String),
    /// Its head, if it has one that parses (else why not).
    pub head: Result<Head, String>,
    /// Its objects' sizes.
    pub sizes: Sizes,
}

/// The tasks of `plan` (every plan when `None`), or the one task named.
pub async fn ls(
    store: &Store,
    plan: Option<&str>,
    task: Option<&str>,
) -> Result<Vec<TaskSummary>, AdminError> {
    let mut out = Vec::new();
    for keys in crate::fetch::task_folders(store, plan, task).await? {
        let (sizes, listed) = gc::sizes(store, &keys).await?;
        if listed.is_empty() {
            continue;
        }
        let head = match read_head(store, &keys).await {
            Ok(Some((h, _))) => Ok(h),
            Ok(None) => Err("no head object".to_owned()),
            Err(e) => Err(e.to_string()),
        };
        out.push(TaskSummary {
            folder: keys.folder(),
            head,
            sizes,
        });
    }
    Ok(out)
}

/// A log segment the head counts.
#[derive(Debug, Clone)]
pub struct SegmentInfo {
    /// Its key.
    pub key: String,
    /// Its holder's epoch.
    pub epoch: u64,
    /// Its number.
    pub seq: u64,
    /// Its size in the store, `None` when the store does not have it.
    pub bytes: Option<u64>,
}

/// A state manifest in the store.
#[derive(Debug, Clone)]
pub struct StateInfo {
    /// Its key.
    pub key: String,
    /// Its size.
    pub bytes: u64,
    /// When the store wrote it.
    pub modified: String,
    /// Whether the head names it.
    pub current: bool,
}

/// One task in detail, as `store show` shows it.
#[derive(Debug, Clone)]
pub struct TaskDetail {
    /// The head.
    pub head: Head,
    /// The log segments the head counts, in order, with their sizes (or missing).
    pub segments: Vec<SegmentInfo>,
    /// Log objects the head does not count (a stale holder's).
    pub uncounted_log: Vec<Listed>,
    /// Records recovered from a disk the store never got them from, uploaded beside the log
    /// (`recovered/`, see `crate::fetch::recovered_key`).
    pub recovered: Vec<Listed>,
    /// The manifests in the store, oldest first.
    pub states: Vec<StateInfo>,
    /// The current manifest's checkpoints (name → segment files) and workspace files, or
    /// why it cannot be read.
    pub current: Option<Result<Manifest, String>>,
    /// Blobs the current manifest names that the store does not have.
    pub missing_blobs: Vec<String>,
    /// Blobs: count and bytes, and of those the current manifest names.
    pub blobs: (u64, u64),
    /// Blobs the current manifest names: count and bytes.
    pub live_blobs: (u64, u64),
    /// Sizes by kind.
    pub sizes: Sizes,
}

/// The task `plan`/`task` in detail.
pub async fn show(store: &Store, plan: &str, task: &str) -> Result<TaskDetail, AdminError> {
    let keys = TaskKeys::new(plan, task);
    let Some((head, _)) = read_head(store, &keys).await? else {
        return Err(AdminError::NoTask {
            plan: plan.to_owned(),
            task: task.to_owned(),
        });
    };
    let (sizes, listed) = gc::sizes(store, &keys).await?;
    let by_key: std::collections::HashMap<&str, &Listed> =
        listed.iter().map(|l| (l.key.as_str(), l)).collect();
    let mut segments = Vec::new();
    let mut counted = std::collections::HashSet::new();
    for run in &head.log {
        for seq in 1..=run.segments {
            let key = keys.segment(run, seq);
            segments.push(SegmentInfo {
                bytes: by_key.get(key.as_str()).map(|l| l.bytes),
                key: key.clone(),
                epoch: run.epoch,
                seq,
            });
            counted.insert(key);
        }
    }
    let base = keys.prefix().as_ref().to_owned();
    let in_folder = |l: &Listed, folder: &str| l.key.starts_with(&format!("{base}/{folder}/"));
    let uncounted_log = listed
        .iter()
        .filter(|l| in_folder(l, "log") && !counted.contains(&l.key))
        .cloned()
        .collect();
    let recovered = listed
        .iter()
        .filter(|l| in_folder(l, "recovered"))
        .cloned()
        .collect();
    let mut states: Vec<StateInfo> = listed
        .iter()
        .filter(|l| in_folder(l, "state"))
        .map(|l| StateInfo {
            key: l.key.clone(),
            bytes: l.bytes,
            modified: l.modified.to_rfc3339(),
            current: head.state.as_deref() == Some(l.key.as_str()),
        })
        .collect();
    states.sort_by(|a, b| a.modified.cmp(&b.modified).then(a.key.cmp(&b.key)));
    let current = match &head.state {
        None => None,
        Some(key) => Some(match store.get(&store.key(key)).await? {
            None => Err(format!("the head names {key}, which is missing")),
            Some((bytes, _)) => serde_json::from_slice::<Manifest>(&bytes)
                .map_err(|e| format!("{key} does not parse: {e}")),
        }),
    };
    let blob_size = |sha: &str| by_key.get(keys.blob(sha).as_str()).map(|l| l.bytes);
    // Segments carried inline in the manifest are in no blob.
    let live = match &current {
        Some(Ok(m)) => m.blobs(),
        _ => Default::default(),
    };
    let mut missing_blobs = Vec::new();
    let mut live_blobs = (0, 0);
    for sha in &live {
        match blob_size(sha) {
            Some(b) => {
                live_blobs.0 += 1;
                live_blobs.1 += b;
            }
            None => missing_blobs.push(sha.clone()),
        }
    }
    Ok(TaskDetail {
        blobs: sizes.blobs,
        head,
        segments,
        uncounted_log,
        recovered,
        states,
        current,
        missing_blobs,
        live_blobs,
        sizes,
    })
}

/// What `release` did.
#[derive(Debug, Clone)]
pub struct Released {
    /// The head before.
    pub before: Head,
    /// The head written (released, epoch bumped), `None` when it was released already and
    /// nothing was asked of it.
    pub after: Option<Head>,
    /// How long the command watched the holder's lease.
    pub watched: Duration,
}

/// The operator, as the holder a release or a collection writes in the head.
pub fn operator(what: &str) -> Holder {
    Holder::me(&format!("flowrepl-store-{what}-{}", uuid::Uuid::new_v4()))
}

/// Swaps the head of `keys` from `(head, version)` to `change(head)` with the epoch bumped
/// and `by` as its holder; the new head and version, or `None` when the head moved.
async fn bump(
    store: &Store,
    keys: &TaskKeys,
    head: &Head,
    version: &UpdateVersion,
    by: &Holder,
    change: impl FnOnce(&mut Head),
) -> Result<Option<(Head, UpdateVersion)>, AdminError> {
    let mut next = head.clone();
    next.epoch = head
        .epoch
        .checked_add(1)
        .filter(|e| *e < u64::MAX)
        .ok_or_else(|| AdminError::EpochExhausted {
            plan: head.plan_id.clone(),
            task: head.task_id.clone(),
        })?;
    next.holder = by.clone();
    next.renewed_at = now();
    next.wanted = None;
    change(&mut next);
    let body = Bytes::from(serde_json::to_vec(&next).expect("a head serializes"));
    match store
        .swap(&store.key(&keys.head()), body, Some(version))
        .await?
    {
        Swapped::Done(v) => Ok(Some((next, v))),
        Swapped::Moved => Ok(None),
    }
}

/// Releases the task `plan`/`task` for another kernel to take at once, with its epoch bumped
/// (so its old holder, should it come back, is fenced at its next write). A holder that has
/// not released it is watched for its whole lease first (by this machine's clock): if it
/// renews meanwhile it is alive, and the task is not released ([`AdminError::Live`]) unless
/// `force`. `drop_state` also makes the head name no state: the next kernel starts without
/// the stored checkpoints and workspace files (the log stays), for a state that is refused.
pub async fn release(
    store: &Store,
    plan: &str,
    task: &str,
    force: bool,
    drop_state: bool,
) -> Result<Released, AdminError> {
    let keys = TaskKeys::new(plan, task);
    let me = operator("release");
    let started = Instant::now();
    for _ in 0..5 {
        let Some((head, version)) = read_head(store, &keys).await? else {
            return Err(AdminError::NoTask {
                plan: plan.to_owned(),
                task: task.to_owned(),
            });
        };
        if head.released && !drop_state {
            return Ok(Released {
                before: head,
                after: None,
                watched: started.elapsed(),
            });
        }
        if !head.released && !force {
            let lease = Duration::from_millis(head.lease_ms.clamp(1_000, 600_000));
            let until = Instant::now() + lease + Duration::from_millis(500);
            while Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(250)).await;
                match store.get(&store.key(&keys.head())).await? {
                    Some((_, v)) if v.e_tag == version.e_tag => {}
                    _ => {
                        let now = read_head(store, &keys).await?.map(|(h, _)| h);
                        if now.as_ref().is_some_and(|h| h.released) {
                            // Let go meanwhile: look again.
                            break;
                        }
                        let h = now.unwrap_or(head);
                        return Err(AdminError::Live {
                            plan: plan.to_owned(),
                            task: task.to_owned(),
                            holder: Box::new(h.holder),
                            epoch: h.epoch,
                        });
                    }
                }
            }
            if Instant::now() < until {
                continue;
            }
        }
        if let Some((after, _)) = bump(store, &keys, &head, &version, &me, |h| {
            h.released = true;
            if drop_state {
                h.state = None;
            }
        })
        .await?
        {
            return Ok(Released {
                before: head,
                after: Some(after),
                watched: started.elapsed(),
            });
        }
    }
    Err(AdminError::Busy {
        plan: plan.to_owned(),
        task: task.to_owned(),
    })
}

/// What `gc` did to one task.
#[derive(Debug, Clone)]
pub enum Collected {
    /// Collected (or, with `dry_run`, what would be).
    Done(Plan),
    /// Not collected: held by a kernel (which collects itself), or taken meanwhile.
    Skipped(String),
}

/// Collects the task `keys` if no one holds it and its head was not written for `idle`:
/// takes its lease for the time it collects (so that no kernel writes meanwhile), removes
/// what [`gc::plan`] says at this machine's time with `grace`, and releases it again. With
/// `dry_run`, only plans.
///
/// A released task may still have a live kernel that parked its lease while idle; taking
/// the lease fences that kernel (its next call is answered "taken over", and `serve` starts
/// another for the task). `idle` (by the store's clock against this machine's) leaves such
/// tasks alone: `serve` stops an idle kernel after `--idle-stop` (15 min by default).
pub async fn gc(
    store: &Store,
    keys: &TaskKeys,
    grace: Duration,
    idle: Duration,
    dry_run: bool,
) -> Result<Collected, AdminError> {
    let Some((head, version)) = read_head(store, keys).await? else {
        return Ok(Collected::Skipped("no head object".into()));
    };
    if !head.released {
        return Ok(Collected::Skipped(format!(
            "held by {} (epoch {}, last renewed at {}): its holder collects; if it is known dead, `flowrepl store release` it first",
            head.holder, head.epoch, head.renewed_at
        )));
    }
    if let Some(at) = store.modified(&store.key(&keys.head())).await? {
        let quiet = (chrono::Utc::now() - at).to_std().unwrap_or(Duration::ZERO);
        if quiet < idle {
            return Ok(Collected::Skipped(format!(
                "released {} s ago, less than --idle-s {} (its kernel may be idle and alive: taking the lease would stop it)",
                quiet.as_secs(),
                idle.as_secs()
            )));
        }
    }
    if dry_run {
        let plan = gc::plan(store, keys, &head, chrono::Utc::now(), grace).await?;
        return Ok(Collected::Done(plan));
    }
    let me = operator("gc");
    let Some((held, held_version)) = bump(store, keys, &head, &version, &me, |h| {
        h.released = false;
        h.lease_ms = 60_000;
    })
    .await?
    else {
        return Ok(Collected::Skipped("taken by a kernel meanwhile".into()));
    };
    let result = async {
        let plan = gc::plan(store, keys, &held, chrono::Utc::now(), grace).await?;
        gc::apply(store, &plan).await?;
        Ok::<Plan, AdminError>(plan)
    }
    .await;
    // Let go again, whatever happened (the epoch stays: nothing was written under it).
    let mut released = held.clone();
    released.released = true;
    released.renewed_at = now();
    let body = Bytes::from(serde_json::to_vec(&released).expect("a head serializes"));
    let let_go = store
        .swap(&store.key(&keys.head()), body, Some(&held_version))
        .await;
    let plan = result?;
    match let_go? {
        Swapped::Done(_) => Ok(Collected::Done(plan)),
        Swapped::Moved => Ok(Collected::Done(plan)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{CommitError, Lease};

    use crate::test_runtime as rt;

    /// `release` refuses a holder that renews while it watches (the attempt), releases one
    /// that does not, and `--force` takes the task from a live one, which is then fenced.
    #[test]
    fn release_refuses_a_live_holder_unless_forced() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
        let lease = Duration::from_millis(1000);
        rt().block_on(async {
            let mut a = Lease::take(&store, "p", "t", Holder::me("a"), lease, lease)
                .await
                .unwrap();
            let renew = async {
                for _ in 0..6 {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    a.commit(|_| {}).await.unwrap();
                }
            };
            let (refused, ()) = tokio::join!(release(&store, "p", "t", false, false), renew);
            assert!(
                matches!(refused, Err(AdminError::Live { epoch: 1, .. })),
                "{refused:?}"
            );
            // Not renewing any more: released after its lease, epoch bumped, a fenced.
            let started = Instant::now();
            let r = release(&store, "p", "t", false, false).await.unwrap();
            assert!(started.elapsed() >= lease, "{:?}", started.elapsed());
            let after = r.after.unwrap();
            assert!(after.released && after.epoch == 2, "{after:?}");
            assert!(matches!(
                a.commit(|_| {}).await,
                Err(CommitError::Fenced { .. })
            ));
            // Released already: nothing to do.
            assert!(release(&store, "p", "t", false, false)
                .await
                .unwrap()
                .after
                .is_none());
            // A live holder, forced: taken at once, and it is fenced.
            let mut b = Lease::take(&store, "p", "t", Holder::me("b"), lease, lease)
                .await
                .unwrap();
            // Held: gc leaves it to its holder.
            let keys = TaskKeys::new("p", "t");
            assert!(matches!(
                gc(&store, &keys, Duration::ZERO, Duration::ZERO, false)
                    .await
                    .unwrap(),
                Collected::Skipped(_)
            ));
            let started = Instant::now();
            let r = release(&store, "p", "t", true, true).await.unwrap();
            assert!(started.elapsed() < lease);
            assert_eq!(r.after.as_ref().unwrap().state, None);
            assert!(matches!(
                b.commit(|_| {}).await,
                Err(CommitError::Fenced { .. })
            ));
            // Released: gc collects (it takes and lets go of the lease).
            assert!(matches!(
                gc(&store, &keys, Duration::ZERO, Duration::ZERO, false)
                    .await
                    .unwrap(),
                Collected::Done(_)
            ));
            let (h, _) = read_head(&store, &keys).await.unwrap().unwrap();
            assert!(h.released, "{h:?}");
        });
    }
}
