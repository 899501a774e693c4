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
//!
//! # The lease by the holder's own clock
//! A taker takes the task only after the head stayed the same version for the holder's whole
//! lease, timed by the taker's clock from when it first saw that version, which is after the
//! holder sent the swap that wrote it. So the holder's lease is good until the moment it sent
//! its last successful swap plus its lease, less a margin for the two clocks' rates
//! ([`good_for`]): [`Lease::good`]. Past that, the holder must renew (a swap, refused when
//! another took the task) before it writes, runs or answers anything.

use crate::head::{now, Head, Holder, TaskKeys, Wanted, HEAD_FORMAT};
use crate::objects::{Store, StoreError, Swapped};
use bytes::Bytes;
use object_store::UpdateVersion;
use std::time::{Duration, Instant};

/// The shortest and longest lease a taker waits out, whatever a head says.
pub const LEASE_BOUNDS_MS: (u64, u64) = (1_000, 600_000);

/// How long a lapsed holder keeps a task from a taker: its lease as its head says, within
/// [`LEASE_BOUNDS_MS`]. A taker's start budget must allow this (not its own lease).
pub fn lapse_of(head: &Head) -> Duration {
    let (lo, hi) = LEASE_BOUNDS_MS;
    Duration::from_millis(head.lease_ms.clamp(lo, hi))
}

/// The part of a lease the holder counts on, from when it sent its last successful swap: the
/// lease less 2 % (two clocks' rates differ by far less) and 100 ms.
pub fn good_for(lease: Duration) -> Duration {
    lease.saturating_sub(lease / 50 + Duration::from_millis(100))
}

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
        holder: Box<Holder>,
        /// Its epoch.
        epoch: u64,
        /// Its lease.
        lease_ms: u64,
    },
    /// Another kernel holds the task and was running a cell all the time this one waited for
    /// it to hand the task over.
    #[error("task {plan}/{task} is busy elsewhere: {holder} (epoch {epoch}) holds it and was still running a cell after {waited_ms} ms; it hands the task over when the cell ends (its handover was asked for)")]
    Busy {
        /// The plan.
        plan: String,
        /// The task.
        task: String,
        /// Who holds it.
        holder: Box<Holder>,
        /// Its epoch.
        epoch: u64,
        /// How long this kernel waited.
        waited_ms: u64,
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
    /// The lease is good until then (by this process's monotonic clock).
    good_until: Instant,
    /// Said once: the head was missing though objects of the task were in the store.
    lost_head: Option<String>,
    /// The head this take replaced (`None`: it created the head).
    replaced: Option<Head>,
}

/// How long [`Lease::take_asking`] waits.
#[derive(Debug, Clone, Copy)]
pub struct Waits {
    /// For a holder that stopped renewing to lapse (its own lease counts, within this).
    pub lapse: Duration,
    /// For a live holder to hand the task over after this taker asked (`None`: do not ask,
    /// give up as soon as the holder is seen alive: [`TakeError::Held`]).
    pub handover: Option<Duration>,
}

fn parse(key: &str, bytes: &[u8]) -> Result<Head, TakeError> {
    let head: Head = serde_json::from_slice(bytes).map_err(|e| TakeError::BadHead {
        key: key.to_owned(),
        why: e.to_string(),
    })?;
    if head.v > HEAD_FORMAT.max(2) {
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
        let waits = Waits {
            lapse: wait,
            handover: None,
        };
        Lease::take_asking(store, plan_id, task_id, me, lease, waits).await
    }

    /// [`Lease::take`], and with `waits.handover`, a live holder is asked to hand the task
    /// over: the head gets a [`Wanted`] (a swap against the version read), which the holder
    /// sees at its next renewal; it lets its running cell end, uploads and releases, and this
    /// taker takes the task then. A holder still holding it after `waits.handover` is
    /// [`TakeError::Busy`].
    pub async fn take_asking(
        store: &Store,
        plan_id: &str,
        task_id: &str,
        me: Holder,
        lease: Duration,
        waits: Waits,
    ) -> Result<Lease, TakeError> {
        let keys = TaskKeys::new(plan_id, task_id);
        let head_key = store.key(&keys.head());
        let started = Instant::now();
        // The version being watched, and when it was first seen.
        let mut watching: Option<(UpdateVersion, Instant)> = None;
        // When this taker asked the holder for the task.
        let mut asked: Option<Instant> = None;
        loop {
            let current = store.get(&head_key).await?;
            let mut lost_head = None;
            let mut replaced = None;
            let (next, expected) = match current {
                None => {
                    // A head that was deleted must not let this holder reuse the names of
                    // earlier ones, nor look like a new task without a word.
                    let (newest, count) = newest_epoch(store, &keys).await?;
                    let epoch = match newest {
                        Some(e) => {
                            let epoch = e.checked_add(1).ok_or_else(|| exhausted(&head_key))?;
                            lost_head = Some(format!(
                                "the task's head ({}) was missing although the store holds {count} objects of it (epochs up to {e}): the head was lost, and the task starts again empty at epoch {epoch}; nothing of the earlier holders was restored (their objects stay in the store)",
                                keys.head()
                            ));
                            epoch
                        }
                        None => 1,
                    };
                    (
                        Head {
                            v: HEAD_FORMAT,
                            plan_id: plan_id.to_owned(),
                            task_id: task_id.to_owned(),
                            epoch,
                            holder: me.clone(),
                            renewed_at: now(),
                            lease_ms: lease.as_millis() as u64,
                            released: false,
                            log: Vec::new(),
                            state: None,
                            wanted: None,
                        },
                        None,
                    )
                }
                Some((bytes, version)) => {
                    let head = parse(head_key.as_ref(), &bytes)?;
                    let free = head.released || head.holder.id == me.id;
                    if !free {
                        let their_lease = lapse_of(&head);
                        // Unchanged for a whole lease (by this taker's clock, from when it
                        // first saw that version): the holder is gone.
                        let lapsed = watching.as_ref().is_some_and(|(seen, since)| {
                            seen.e_tag == version.e_tag && since.elapsed() >= their_lease
                        });
                        let renewed = watching
                            .as_ref()
                            .is_some_and(|(seen, _)| seen.e_tag != version.e_tag);
                        if lapsed {
                            tracing::info!(holder = %head.holder, epoch = head.epoch, "the task's holder let its lease lapse; taking the task");
                        } else if let Some(handover) = waits.handover {
                            let asked_at = *asked.get_or_insert_with(Instant::now);
                            if renewed && asked_at.elapsed() >= handover {
                                return Err(TakeError::Busy {
                                    plan: head.plan_id.clone(),
                                    task: head.task_id.clone(),
                                    holder: Box::new(head.holder.clone()),
                                    epoch: head.epoch,
                                    waited_ms: asked_at.elapsed().as_millis() as u64,
                                });
                            }
                            if started.elapsed() >= waits.lapse {
                                return Err(held(&head));
                            }
                            if head.wanted.as_ref().is_none_or(|w| w.by != me) {
                                let mut ask = head.clone();
                                ask.wanted = Some(Wanted {
                                    by: me.clone(),
                                    at: now(),
                                });
                                ask.v = HEAD_FORMAT;
                                match store.swap(&head_key, encode(&ask), Some(&version)).await? {
                                    Swapped::Done(v) => {
                                        tracing::info!(holder = %head.holder, epoch = head.epoch, "the task is held: asked its holder to hand it over");
                                        // A holder that is dead lapses from here.
                                        watching = Some((v, Instant::now()));
                                    }
                                    Swapped::Moved => watching = None,
                                }
                            } else if watching.is_none() || renewed {
                                watching = Some((version, Instant::now()));
                            }
                            tokio::time::sleep(ASK_POLL).await;
                            continue;
                        } else if renewed {
                            return Err(held(&head));
                        } else {
                            if started.elapsed() >= waits.lapse {
                                return Err(held(&head));
                            }
                            if watching.is_none() {
                                watching = Some((version, Instant::now()));
                            }
                            tokio::time::sleep(poll(their_lease)).await;
                            continue;
                        }
                    }
                    replaced = Some(head.clone());
                    let mut next = head;
                    next.epoch = next
                        .epoch
                        .checked_add(1)
                        .ok_or_else(|| exhausted(&head_key))?;
                    next.v = HEAD_FORMAT;
                    next.holder = me.clone();
                    next.renewed_at = now();
                    next.lease_ms = lease.as_millis() as u64;
                    next.released = false;
                    next.wanted = None;
                    (next, Some(version))
                }
            };
            let sent = Instant::now();
            match store
                .swap(&head_key, encode(&next), expected.as_ref())
                .await?
            {
                Swapped::Done(version) => {
                    tracing::info!(epoch = next.epoch, "took the task in the store");
                    if let Some(w) = &lost_head {
                        tracing::warn!("{w}");
                    }
                    return Ok(Lease {
                        store: store.clone(),
                        keys,
                        head: next,
                        version,
                        committed: Instant::now(),
                        good_until: sent + good_for(lease),
                        lost_head,
                        replaced,
                    });
                }
                // Another taker won the race: look again.
                Swapped::Moved => watching = None,
            }
        }
    }

    /// The head as it was just before this take replaced it (`None`: the take created it).
    /// Its `released` says whether the previous holder let go (a clean stop, a handover, an
    /// idle holder's parked lease) or was taken over without (it died, or lost the store).
    pub fn replaced(&self) -> Option<&Head> {
        self.replaced.as_ref()
    }

    /// Whether this holder's lease is good now by its own clock (see the module's text).
    pub fn good(&self) -> bool {
        Instant::now() < self.good_until
    }

    /// Until when the lease is good by this process's clock.
    pub fn good_until(&self) -> Instant {
        self.good_until
    }

    /// Another kernel asked for the task ([`Lease::take_asking`]), as the head said at this
    /// holder's last swap.
    pub fn wanted(&self) -> Option<&Wanted> {
        self.head.wanted.as_ref()
    }

    /// Once: the head was missing although objects of the task were in the store (the task
    /// started again empty).
    pub fn take_lost_head(&mut self) -> Option<String> {
        self.lost_head.take()
    }

    /// The id in the names of this holder's objects.
    pub fn writer(&self) -> String {
        self.head.holder.writer()
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
        let lease = Duration::from_millis(self.head.lease_ms);
        loop {
            let sent = Instant::now();
            match self
                .store
                .swap(&key, encode(&next), Some(&self.version))
                .await?
            {
                Swapped::Done(version) => {
                    self.head = next;
                    self.version = version;
                    self.committed = Instant::now();
                    self.good_until = sent + good_for(lease);
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
                            // The same epoch and holder: nobody took the task since this
                            // holder's last swap (a taker bumps the epoch). It is this holder's
                            // own swap whose answer was lost (a park among them), or an
                            // asker's handover request, or an operator's release: swap again.
                            if theirs.epoch == self.head.epoch && theirs.holder == self.head.holder
                            {
                                // A handover request written meanwhile is kept (and seen).
                                if theirs.wanted != self.head.wanted {
                                    tracing::info!(by = ?theirs.wanted.as_ref().map(|w| w.by.to_string()), "a handover of the task was asked for");
                                }
                                next.wanted = theirs.wanted.clone();
                                self.head.wanted = theirs.wanted;
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
                                    ..Holder::default()
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

    /// Lets go of the task (a clean stop, or a handover): another kernel may take it at once.
    /// The lease is not good from here on.
    pub async fn release(&mut self) -> Result<(), CommitError> {
        self.commit(|h| h.released = true).await?;
        self.good_until = Instant::now();
        Ok(())
    }
}

/// How often an asker looks for the holder's release.
const ASK_POLL: Duration = Duration::from_millis(200);

fn exhausted(key: &object_store::path::Path) -> TakeError {
    TakeError::BadHead {
        key: key.to_string(),
        why: format!("its epoch is {} (the largest there is), so the task cannot be taken again without reusing an epoch (a hand-edited head?); an operator can remove the task's folder to start it afresh", u64::MAX),
    }
}

/// The newest epoch among the task's log segments and state manifests, and how many there
/// are (a task whose head is missing).
async fn newest_epoch(store: &Store, keys: &TaskKeys) -> Result<(Option<u64>, usize), StoreError> {
    let mut names = store.files(&keys.log_folder()).await?;
    names.extend(store.files(&keys.state_folder()).await?);
    let newest = names
        .iter()
        .filter_map(|n| crate::head::epoch_of_key(n))
        .max();
    Ok((newest.or((!names.is_empty()).then_some(0)), names.len()))
}

fn held(head: &Head) -> TakeError {
    TakeError::Held {
        plan: head.plan_id.clone(),
        task: head.task_id.clone(),
        holder: Box::new(head.holder.clone()),
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
            session: String::new(),
        }
    }

    use crate::test_runtime as rt;

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

    #[test]
    fn the_lease_is_good_by_this_clock_until_its_end_less_a_margin() {
        assert_eq!(
            good_for(Duration::from_secs(15)),
            Duration::from_millis(14_600)
        );
        assert_eq!(good_for(Duration::from_millis(50)), Duration::ZERO);
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
        rt().block_on(async {
            let lease = Duration::from_millis(1000);
            let mut a = Lease::take(&store, "p", "t", holder("a"), lease, lease)
                .await
                .unwrap();
            assert!(a.good());
            tokio::time::sleep(good_for(lease)).await;
            assert!(!a.good(), "past its lease less the margin");
            a.commit(|_| {}).await.unwrap();
            assert!(a.good(), "renewed");
            a.release().await.unwrap();
            assert!(!a.good(), "released");
        });
    }

    #[test]
    fn a_deleted_head_starts_after_the_newest_epoch_and_a_full_epoch_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
        let lease = Duration::from_millis(1000);
        rt().block_on(async {
            let mut a = Lease::take(&store, "p", "t", holder("a"), lease, lease)
                .await
                .unwrap();
            assert!(
                a.take_lost_head().is_none(),
                "a new task is not a lost head"
            );
            let keys = a.keys().clone();
            // Objects of epochs 1 and 7 (one written by hand), then the head removed.
            a.commit(|h| h.epoch = 7).await.unwrap();
            let run = crate::head::LogRun {
                epoch: 7,
                segments: 1,
                bytes: 3,
                writer: Some("a".into()),
            };
            let seg = store.key(&keys.segment(&run, 1));
            store
                .put_new(&seg, Bytes::from_static(b"{}\n"))
                .await
                .unwrap();
            store
                .put_new(
                    &store.key(&keys.state(1, "a", 1)),
                    Bytes::from_static(b"{}"),
                )
                .await
                .unwrap();
            store.remove(&store.key(&keys.head())).await.unwrap();
            let mut b = Lease::take(&store, "p", "t", holder("b"), lease, lease)
                .await
                .unwrap();
            assert_eq!(b.head().epoch, 8, "{:?}", b.head());
            assert_eq!(b.head().log, vec![], "nothing of the old holders is taken");
            assert_eq!(b.head().state, None);
            let said = b.take_lost_head().expect("the lost head is said");
            assert!(
                said.contains("was lost") && said.contains("epochs up to 7"),
                "{said}"
            );
            // Another holder's object under the same name, with other content: an error,
            // never taken as this writer's own earlier write; the same content is.
            assert!(matches!(
                store.put_new(&seg, Bytes::from_static(b"other\n")).await,
                Err(StoreError::Clash { .. })
            ));
            store
                .put_new(&seg, Bytes::from_static(b"{}\n"))
                .await
                .unwrap();
            // A head at the largest epoch is refused, not wrapped.
            b.commit(|h| h.epoch = u64::MAX).await.unwrap();
            b.release().await.unwrap();
            match Lease::take(&store, "p", "t", holder("c"), lease, lease).await {
                Err(TakeError::BadHead { why, .. }) => {
                    assert!(why.contains("18446744073709551615"), "{why}")
                }
                other => panic!("{other:?}"),
            }
        });
    }

    #[test]
    fn a_live_holder_hands_the_task_over_when_asked_and_a_busy_one_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
        let lease = Duration::from_millis(1500);
        rt().block_on(async {
            let mut a = Lease::take(&store, "p", "t", holder("a"), lease, lease)
                .await
                .unwrap();
            let waits = Waits {
                lapse: Duration::from_secs(10),
                handover: Some(Duration::from_millis(1200)),
            };
            // A holder that keeps renewing and never lets go (a long cell): busy elsewhere,
            // naming it, once the asker's wait is over.
            let asker = Lease::take_asking(&store, "p", "t", holder("b"), lease, waits);
            let busy = async {
                for _ in 0..8 {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    a.commit(|_| {}).await.unwrap();
                }
            };
            let started = Instant::now();
            let (taken, ()) = tokio::join!(asker, busy);
            match taken {
                Err(TakeError::Busy {
                    holder, epoch: 1, ..
                }) => assert_eq!(holder.id, "a"),
                other => panic!("{other:?}"),
            }
            assert!(started.elapsed() < Duration::from_secs(3));
            // The holder saw the request at its renewals.
            assert_eq!(a.wanted().map(|w| w.by.id.as_str()), Some("b"));
            // A holder that lets go when asked: the asker takes the task at once.
            let asker = Lease::take_asking(&store, "p", "t", holder("c"), lease, waits);
            let hands_over = async {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    a.commit(|_| {}).await.unwrap();
                    if a.wanted().is_some_and(|w| w.by.id == "c") {
                        a.release().await.unwrap();
                        return;
                    }
                }
            };
            let started = Instant::now();
            let (taken, ()) = tokio::join!(asker, hands_over);
            let c = taken.unwrap();
            assert!(started.elapsed() < lease, "{:?}", started.elapsed());
            assert_eq!(c.head().epoch, 2);
            assert_eq!(c.wanted(), None);
        });
    }
}
