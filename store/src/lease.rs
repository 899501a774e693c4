//! One holder per task, enforced by the store: taking the task's head, renewing it, committing
//! through it, and letting go.
//!
//! A taker reads the head. None: it creates one (`If-None-Match: *`). Released, or held by
//! this same kernel run: it takes it at once. Held by another: it watches the head's version
//! by its own clock (no clock is compared across machines). If the version stays the same for
//! the holder's whole lease, the holder is gone and the taker takes the task; if it changes
//! without a release, the holder is alive, and the taker gives up at once ([`TakeError::Held`]).
//! Taking is a swap against the version read, with the epoch bumped, so of two takers only one
//! wins. From then on every write of the holder's is committed by swapping the head against
//! the version it last wrote; a refused swap means another took the task
//! ([`CommitError::Fenced`]), and the holder must stop writing.

use crate::head::{now, Head, Holder, TaskKeys, HEAD_FORMAT};
use crate::objects::{Store, StoreError, Swapped};
use bytes::Bytes;
use object_store::UpdateVersion;
use std::time::{Duration, Instant};

/// The shortest and longest lease a taker waits out, whatever a head says.
const LEASE_BOUNDS_MS: (u64, u64) = (1_000, 600_000);

/// Why the task could not be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TakeError {
    /// Another kernel holds the task and keeps renewing its lease.
    #[error("task {plan}/{task} is held by {holder} (epoch {epoch}), which renewed its lease while this kernel waited; it is released when that kernel stops, or lapses {lease_ms} ms after its last renewal")]
    Held {
        /// The plan.
        plan: String,
        /// The task.
        task: String,
        /// Who holds it.
        holder: Holder,
        /// Its epoch.
        epoch: u64,
        /// Its lease.
        lease_ms: u64,
    },
    /// The head is not one this flowrepl reads.
    #[error("the task's head object {key} cannot be read: {why}")]
    BadHead {
        /// Its key.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a commit was not made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// Another kernel took the task: this one must not write again.
    #[error("task {plan}/{task} was taken over by {holder} (epoch {epoch}); this kernel (epoch {mine}) stopped writing to the store")]
    Fenced {
        /// The plan.
        plan: String,
        /// The task.
        task: String,
        /// The new holder, as far as the head says.
        holder: Holder,
        /// Its epoch.
        epoch: u64,
        /// This kernel's epoch.
        mine: u64,
    },
    /// The store failed (retry later).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A task this kernel holds.
#[derive(Debug)]
pub struct Lease {
    store: Store,
    keys: TaskKeys,
    head: Head,
    version: UpdateVersion,
    committed: Instant,
}

fn parse(key: &str, bytes: &[u8]) -> Result<Head, TakeError> {
    let head: Head = serde_json::from_slice(bytes).map_err(|e| TakeError::BadHead {
        key: key.to_owned(),
        why: e.to_string(),
    })?;
    if head.v > HEAD_FORMAT {
        return Err(TakeError::BadHead {
            key: key.to_owned(),
            why: format!(
                "format {} (this flowrepl writes {HEAD_FORMAT}): a newer flowrepl holds the store",
                head.v
            ),
        });
    }
    Ok(head)
}

fn encode(head: &Head) -> Bytes {
    Bytes::from(serde_json::to_vec(head).expect("a head serializes"))
}

impl Lease {
    /// Takes the task for `me`, with a lease of `lease`, waiting (at most `wait`) for a
    /// holder that stopped renewing to lapse. `None` from the callback means the head was
    /// created by this take (a task the store did not have).
    pub async fn take(
        store: &Store,
        plan_id: &str,
        task_id: &str,
        me: Holder,
        lease: Duration,
        wait: Duration,
    ) -> Result<Lease, TakeError> {
        let keys = TaskKeys::new(plan_id, task_id);
        let head_key = store.key(&keys.head());
        let started = Instant::now();
        // The version being watched, and when it was first seen.
        let mut watching: Option<(UpdateVersion, Instant)> = None;
        loop {
            let current = store.get(&head_key).await?;
            let (next, expected) = match current {
                None => (
                    Head {
                        v: HEAD_FORMAT,
                        plan_id: plan_id.to_owned(),
                        task_id: task_id.to_owned(),
                        epoch: 1,
                        holder: me.clone(),
                        renewed_at: now(),
                        lease_ms: lease.as_millis() as u64,
                        released: false,
                        log: Vec::new(),
                        state: None,
                    },
                    None,
                ),
                Some((bytes, version)) => {
                    let head = parse(head_key.as_ref(), &bytes)?;
                    let free = head.released || head.holder.id == me.id;
                    if !free {
                        let (lease_ms_min, lease_ms_max) = LEASE_BOUNDS_MS;
                        let their_lease =
                            Duration::from_millis(head.lease_ms.clamp(lease_ms_min, lease_ms_max));
                        match &watching {
                            Some((seen, since)) if seen.e_tag == version.e_tag => {
                                if since.elapsed() < their_lease {
                                    if started.elapsed() >= wait {
                                        return Err(held(&head));
                                    }
                                    tokio::time::sleep(poll(their_lease)).await;
                                    continue;
                                }
                                // Unchanged for a whole lease: the holder is gone.
                                tracing::info!(holder = %head.holder, epoch = head.epoch, "the task's holder let its lease lapse; taking the task");
                            }
                            Some(_) => return Err(held(&head)),
                            None => {
                                watching = Some((version, Instant::now()));
                                tokio::time::sleep(poll(their_lease)).await;
                                continue;
                            }
                        }
                    }
                    let mut next = head;
                    next.epoch += 1;
                    next.holder = me.clone();
                    next.renewed_at = now();
                    next.lease_ms = lease.as_millis() as u64;
                    next.released = false;
                    (next, Some(version))
                }
            };
            match store
                .swap(&head_key, encode(&next), expected.as_ref())
                .await?
            {
                Swapped::Done(version) => {
                    tracing::info!(epoch = next.epoch, "took the task in the store");
                    return Ok(Lease {
                        store: store.clone(),
                        keys,
                        head: next,
                        version,
                        committed: Instant::now(),
                    });
                }
                // Another taker won the race: look again.
                Swapped::Moved => watching = None,
            }
        }
    }

    /// The head as this holder last wrote it.
    pub fn head(&self) -> &Head {
        &self.head
    }

    /// The task's keys.
    pub fn keys(&self) -> &TaskKeys {
        &self.keys
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// When the head was last written by this holder.
    pub fn committed(&self) -> Instant {
        self.committed
    }

    /// Swaps the head for `change(head)` (its time renewed), against the version this holder
    /// last wrote.
    pub async fn commit(&mut self, change: impl FnOnce(&mut Head)) -> Result<(), CommitError> {
        let mut next = self.head.clone();
        change(&mut next);
        next.renewed_at = now();
        let key = self.store.key(&self.keys.head());
        loop {
            match self
                .store
                .swap(&key, encode(&next), Some(&self.version))
                .await?
            {
                Swapped::Done(version) => {
                    self.head = next;
                    self.version = version;
                    self.committed = Instant::now();
                    return Ok(());
                }
                Swapped::Moved => {
                    // Either another holder, or this holder's own earlier swap that landed
                    // although its answer was lost: then adopt it and swap again.
                    let current = self.store.get(&key).await?;
                    match current {
                        Some((bytes, version)) => {
                            let theirs: Head = serde_json::from_slice(&bytes).map_err(|e| {
                                CommitError::Store(StoreError::Local {
                                    what: format!("the head {key} is not readable"),
                                    source: std::io::Error::other(e),
                                })
                            })?;
                            if theirs.epoch == self.head.epoch
                                && theirs.holder == self.head.holder
                                && !theirs.released
                            {
                                self.version = version;
                                continue;
                            }
                            return Err(CommitError::Fenced {
                                plan: self.head.plan_id.clone(),
                                task: self.head.task_id.clone(),
                                holder: theirs.holder,
                                epoch: theirs.epoch,
                                mine: self.head.epoch,
                            });
                        }
                        None => {
                            return Err(CommitError::Fenced {
                                plan: self.head.plan_id.clone(),
                                task: self.head.task_id.clone(),
                                holder: Holder {
                                    id: "(none: the head was removed)".into(),
                                    host: String::new(),
                                    pid: 0,
                                },
                                epoch: 0,
                                mine: self.head.epoch,
                            })
                        }
                    }
                }
            }
        }
    }

    /// Lets go of the task (a clean stop): another kernel may take it at once.
    pub async fn release(&mut self) -> Result<(), CommitError> {
        self.commit(|h| h.released = true).await
    }
}

fn held(head: &Head) -> TakeError {
    TakeError::Held {
        plan: head.plan_id.clone(),
        task: head.task_id.clone(),
        holder: head.holder.clone(),
        epoch: head.epoch,
        lease_ms: head.lease_ms,
    }
}

/// How often a taker looks at a held head: often enough to see a renewal soon after it
/// happens (a holder renews every third of its lease).
fn poll(lease: Duration) -> Duration {
    (lease / 10).clamp(Duration::from_millis(100), Duration::from_millis(500))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(id: &str) -> Holder {
        Holder {
            id: id.into(),
            host: "here".into(),
            pid: 1,
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn one_holder_at_a_time_in_a_file_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
        let lease = Duration::from_millis(1000);
        rt().block_on(async {
            let mut a = Lease::take(&store, "p", "t", holder("a"), lease, Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(a.head().epoch, 1);
            // A holder that keeps renewing: the taker gives up as soon as it sees a renewal.
            let taker = Lease::take(&store, "p", "t", holder("b"), lease, Duration::from_secs(5));
            let renew = async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                a.commit(|_| {}).await.unwrap();
            };
            let (taken, ()) = tokio::join!(taker, renew);
            assert!(
                matches!(taken, Err(TakeError::Held { epoch: 1, .. })),
                "{taken:?}"
            );
            // A holder that stops renewing: taken once its lease has passed unchanged.
            let started = Instant::now();
            let mut b = Lease::take(&store, "p", "t", holder("b"), lease, Duration::from_secs(5))
                .await
                .unwrap();
            assert!(started.elapsed() >= lease, "{:?}", started.elapsed());
            assert_eq!(b.head().epoch, 2);
            // The old holder's next commit is refused, and names the new one.
            match a.commit(|h| h.state = Some("mine".into())).await {
                Err(CommitError::Fenced {
                    epoch: 2,
                    mine: 1,
                    holder,
                    ..
                }) => {
                    assert_eq!(holder.id, "b")
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(b.head().state, None);
            // A release lets the next taker in at once.
            b.release().await.unwrap();
            let started = Instant::now();
            let c = Lease::take(&store, "p", "t", holder("c"), lease, Duration::from_secs(5))
                .await
                .unwrap();
            assert!(started.elapsed() < lease);
            assert_eq!(c.head().epoch, 3);
        });
    }
}
