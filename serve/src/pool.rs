//! The kernels of a server, one per task: started on first use, stopped when idle past
//! `--idle-stop` or to make room at `--max-kernels` (least recently used idle one first,
//! checkpointed before it stops), started again from the checkpoint on the task's next call,
//! and restarted the same way when one died.

use super::child::{Child, ChildError, Spawn, TaskKey};
use flowrepl_os::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why a call found no kernel.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// At `--max-kernels` with every kernel busy.
    #[error("all {0} kernels (--max-kernels) are running a call; try again when one is idle, or stop one with stop_kernel")]
    Full(u32),
    /// The server is shutting down.
    #[error("the server is shutting down")]
    Closing,
    /// The kernel did not start.
    #[error(transparent)]
    Child(#[from] ChildError),
}

/// A task's place: its kernel, once started (the async lock serializes its start).
type Slot = Arc<tokio::sync::Mutex<Option<Arc<Child>>>>;

/// Settings of the pool.
#[derive(Debug, Clone)]
pub struct Limits {
    /// `--max-kernels`.
    pub max_kernels: u32,
    /// `--idle-stop` (zero: never).
    pub idle_stop: Duration,
    /// The kernels' kill grace: how long a stop waits for a running cell.
    pub grace: Duration,
}

/// What `list_kernels` says of a kernel.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct KernelInfo {
    /// The plan id.
    pub plan: String,
    /// The task id.
    pub task: String,
    /// `busy` (a call running), `idle`, or `exited` (it died; the next call restarts it from
    /// its checkpoint).
    pub state: String,
    /// `sandboxed` or `worker`.
    pub mode: String,
    /// The kernel's process id.
    pub pid: u32,
    /// Resident memory of the kernel and its worker, in KiB (proportional set size where the
    /// host reports it).
    pub memory_kb: u64,
    /// `execute_code` calls answered by this kernel process.
    pub cells: u64,
    /// Seconds since its last call ended.
    pub idle_s: f64,
    /// Seconds since it started.
    pub uptime_s: f64,
    /// Its workspace.
    pub workspace: String,
}

/// How [`Pool::stop_when`] stops a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Checkpointed if it can be, stopped in any case (shutdown, and the user's stop of a
    /// kernel that is busy or has exited).
    Always,
    /// Only if it is still idle (evictions).
    IfIdle,
    /// Only if its checkpoint succeeds (`stop_kernel`).
    IfSaved,
}

/// The kernels.
pub struct Pool {
    spawn: Spawn,
    limits: Limits,
    slots: Mutex<HashMap<TaskKey, Slot>>,
    closing: std::sync::atomic::AtomicBool,
}

impl Pool {
    /// An empty pool.
    pub fn new(spawn: Spawn, limits: Limits) -> Arc<Pool> {
        Arc::new(Pool {
            spawn,
            limits,
            slots: Mutex::new(HashMap::new()),
            closing: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether the kernels' workers are sandboxed.
    pub fn sandboxed(&self) -> bool {
        self.spawn.sandboxed()
    }

    /// `--max-kernels`.
    pub fn max_kernels(&self) -> u32 {
        self.limits.max_kernels
    }

    /// The task's kernel, started (from its checkpoint, if it has one) when it has none or
    /// its kernel died.
    pub async fn kernel(&self, key: &TaskKey) -> Result<Arc<Child>, PoolError> {
        if self.closing.load(std::sync::atomic::Ordering::Acquire) {
            return Err(PoolError::Closing);
        }
        let slot = Arc::clone(lock(&self.slots).entry(key.clone()).or_default());
        let mut held = slot.lock().await;
        if let Some(k) = held.as_ref().filter(|k| !k.ended()) {
            // Not idle from now on: the idle stop must not take it before the call starts.
            k.touch();
            return Ok(Arc::clone(k));
        }
        if let Some(dead) = held.take() {
            tracing::info!(task = %key.task, pid = dead.pid, "the task's kernel had exited: starting it again from its checkpoint");
            dead.reap();
        }
        let started = match self.make_room(key).await {
            Ok(()) => Child::start(key.clone(), &self.spawn)
                .await
                .map_err(PoolError::from),
            Err(e) => Err(e),
        };
        match started {
            Ok(child) => {
                tracing::info!(plan = %key.plan, task = %key.task, pid = child.pid, "kernel started");
                *held = Some(Arc::clone(&child));
                Ok(child)
            }
            Err(e) => {
                // A task whose kernel never started is not kept (its name could be anything).
                drop(held);
                self.forget_if_empty(key, slot);
                Err(e)
            }
        }
    }

    /// Removes `key`'s slot when it holds no kernel and nobody else holds it (slots are
    /// cloned only under the table's lock, so a count of two, the table's and `slot`, taken
    /// under it means nobody waits for it): the table keeps only tasks with a kernel.
    fn forget_if_empty(&self, key: &TaskKey, slot: Slot) {
        let mut slots = lock(&self.slots);
        let empty = slot.try_lock().is_ok_and(|k| k.is_none());
        if empty && Arc::strong_count(&slot) == 2 {
            slots.remove(key);
        }
    }

    /// The task's kernel if it runs (never started for this).
    pub fn running_kernel(&self, key: &TaskKey) -> Option<Arc<Child>> {
        let slot = lock(&self.slots).get(key).cloned()?;
        let kernel = slot.try_lock().ok()?.clone();
        kernel.filter(|k| !k.ended())
    }

    /// The running kernels (not those starting).
    fn running(&self) -> Vec<Arc<Child>> {
        let slots: Vec<Slot> = lock(&self.slots).values().cloned().collect();
        slots
            .iter()
            .filter_map(|s| s.try_lock().ok().and_then(|k| k.clone()))
            .filter(|k| !k.ended())
            .collect()
    }

    /// Kernels running or starting, besides `key`'s.
    fn occupied(&self, key: &TaskKey) -> usize {
        let slots: Vec<(TaskKey, Slot)> = lock(&self.slots)
            .iter()
            .filter(|(k, _)| *k != key)
            .map(|(k, s)| (k.clone(), Arc::clone(s)))
            .collect();
        slots
            .iter()
            .filter(|(_, s)| match s.try_lock() {
                Ok(k) => k.as_ref().is_some_and(|k| !k.ended()),
                Err(_) => true, // starting or stopping
            })
            .count()
    }

    /// At the limit, stops the least recently used idle kernel (not `key`'s).
    async fn make_room(&self, key: &TaskKey) -> Result<(), PoolError> {
        loop {
            if self.occupied(key) < self.limits.max_kernels as usize {
                return Ok(());
            }
            let running = self.running();
            let lru = running
                .into_iter()
                .filter(|k| !k.busy() && &k.key != key)
                .min_by_key(|k| k.last_use());
            match lru {
                Some(k) => {
                    tracing::info!(task = %k.key.task, "at --max-kernels: stopping the least recently used idle kernel");
                    self.stop_idle(&k.key).await;
                }
                None => return Err(PoolError::Full(self.limits.max_kernels)),
            }
        }
    }

    /// Checkpoints and stops the task's kernel; its checkpoint's text, or `None` when it had
    /// no kernel running.
    pub async fn stop(&self, key: &TaskKey) -> Option<String> {
        self.stop_when(key, Stop::Always)
            .await
            .map(|r| r.unwrap_or_else(|why| why))
    }

    /// `stop_kernel`: like [`Pool::stop`], but a kernel whose checkpoint fails is kept (its
    /// variables would be lost): `Some(Err(why))`.
    pub async fn stop_kept_unless_saved(&self, key: &TaskKey) -> Option<Result<String, String>> {
        self.stop_when(key, Stop::IfSaved).await
    }

    /// [`Pool::stop`] for an eviction (idle, or room for another): not when the kernel became
    /// busy after it was chosen (a call started on it meanwhile).
    async fn stop_idle(&self, key: &TaskKey) -> Option<String> {
        self.stop_when(key, Stop::IfIdle)
            .await
            .map(|r| r.unwrap_or_else(|why| why))
    }

    /// Stops the task's kernel as `how` says, under its slot's lock (so that no call starts
    /// on it between the checks and the stop); `Err` only with [`Stop::IfSaved`].
    async fn stop_when(&self, key: &TaskKey, how: Stop) -> Option<Result<String, String>> {
        let slot = lock(&self.slots).get(key).cloned()?;
        let mut held = slot.lock().await;
        let kernel = held.as_ref()?;
        if how == Stop::IfIdle && kernel.busy() {
            return None;
        }
        // The checkpoint is taken here, before anything is stopped, when a failure must keep
        // the kernel; otherwise the stop takes it (and a failure is only said).
        let saved = match how {
            Stop::IfSaved if !kernel.ended() && !kernel.busy() => {
                match kernel.checkpoint(self.limits.grace).await {
                    Ok(text) => Some(text),
                    Err(why) => return Some(Err(why)),
                }
            }
            _ => None,
        };
        let child = held.take()?;
        let said = child.stop(saved.is_none(), self.limits.grace).await;
        tracing::info!(task = %key.task, pid = child.pid, "kernel stopped");
        drop(held);
        self.forget_if_empty(key, slot);
        Some(Ok(saved.or(said).unwrap_or_else(|| {
            "stopped (no checkpoint taken: it was busy or had exited)".into()
        })))
    }

    /// Stops the kernels idle past `--idle-stop`; runs until the pool closes.
    pub async fn stop_idle_ones(self: Arc<Self>) {
        let idle = self.limits.idle_stop;
        if idle.is_zero() {
            return;
        }
        let every = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(10));
        loop {
            tokio::time::sleep(every).await;
            if self.closing.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            let now = Instant::now();
            for k in self.running() {
                if !k.busy() && now.duration_since(k.last_use()) >= idle {
                    tracing::info!(task = %k.key.task, idle_s = idle.as_secs(), "idle: checkpointing and stopping the kernel");
                    self.stop_idle(&k.key).await;
                }
            }
        }
    }

    /// What `list_kernels` shows: every kernel running or exited, by task.
    pub fn list(&self) -> Vec<KernelInfo> {
        let slots: Vec<Slot> = lock(&self.slots).values().cloned().collect();
        let now = Instant::now();
        let mut out: Vec<KernelInfo> = slots
            .iter()
            .filter_map(|s| s.try_lock().ok().and_then(|k| k.clone()))
            .map(|k| KernelInfo {
                plan: k.key.plan.clone(),
                task: k.key.task.clone(),
                state: if k.ended() {
                    "exited"
                } else if k.busy() {
                    "busy"
                } else {
                    "idle"
                }
                .into(),
                mode: self.spawn.mode().into(),
                pid: k.pid,
                memory_kb: tree_memory_kb(k.pid),
                cells: k.cells(),
                idle_s: round3(now.duration_since(k.last_use()).as_secs_f64()),
                uptime_s: round3(now.duration_since(k.started).as_secs_f64()),
                workspace: k.workspace.display().to_string(),
            })
            .collect();
        out.sort_by(|a, b| (&a.plan, &a.task).cmp(&(&b.plan, &b.task)));
        out
    }

    /// Stops every kernel: new calls are refused, and so are calls queued inside a kernel
    /// behind its running cell ("the server is shutting down"); running cells get up to the
    /// kill grace to finish, then each kernel is checkpointed (when idle) and stopped.
    /// Returns how many.
    pub async fn close(self: &Arc<Self>) -> usize {
        self.closing
            .store(true, std::sync::atomic::Ordering::Release);
        for kernel in self.running() {
            kernel.drain().await;
        }
        let deadline = Instant::now() + self.limits.grace;
        while self.running().iter().any(|k| k.busy()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let keys: Vec<TaskKey> = lock(&self.slots).keys().cloned().collect();
        let mut stops = tokio::task::JoinSet::new();
        for key in keys {
            let pool = Arc::clone(self);
            stops.spawn(async move { pool.stop(&key).await });
        }
        stops.join_all().await.into_iter().flatten().count()
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The memory of process `pid` and its descendants: the sum of their PSS (`smaps_rollup`),
/// or of their RSS where that cannot be read.
fn tree_memory_kb(pid: u32) -> u64 {
    let mut total = 0;
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        total += process_memory_kb(p);
        for t in std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            todo.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    total
}

fn process_memory_kb(pid: u32) -> u64 {
    let field = |file: &str, name: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/{file}"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    field("smaps_rollup", "Pss:")
        .or_else(|| field("status", "VmRSS:"))
        .unwrap_or(0)
}
