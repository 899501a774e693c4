//! Cells still running when their `execute_code` call answered (`wait_s` passed): their
//! result is kept here for `wait_cell`, once.
//!
//! At most [`MAX_PARKED`] cells are kept; past that the oldest is forgotten (its cell still
//! runs, and its record still goes to the task log).

use super::Ticket;
use rmcp::model::CallToolResult;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Cells kept for `wait_cell`.
pub const MAX_PARKED: usize = 256;

/// A cell waiting to be collected.
pub struct Waiting {
    /// Its result, when it comes.
    pub rx: oneshot::Receiver<CallToolResult>,
    /// When its call arrived.
    pub started: Instant,
    /// Its place in the queue.
    pub ticket: Arc<Ticket>,
}

/// What [`Parked::take`] found.
pub enum Take {
    /// The cell, for this caller to wait on (and to [`Parked::put_back`] if it stops first).
    Got(Waiting),
    /// Another `wait_cell` call is waiting on it.
    Busy,
    /// No such cell: never parked, already collected, or forgotten.
    Unknown,
}

/// The parked cells, by cell id (the call's ticket).
#[derive(Default)]
pub struct Parked {
    cells: HashMap<u64, Slot>,
    order: VecDeque<u64>,
}

/// A parked cell: its ticket (kept while a waiter has taken it, so it can still be
/// interrupted by id) and the cell when nobody waits on it.
struct Slot {
    ticket: Arc<Ticket>,
    waiting: Option<Waiting>,
}

impl Parked {
    /// Keeps cell `id` (forgetting the oldest past [`MAX_PARKED`]).
    pub fn park(&mut self, id: u64, waiting: Waiting) {
        let ticket = Arc::clone(&waiting.ticket);
        self.cells.insert(
            id,
            Slot {
                ticket,
                waiting: Some(waiting),
            },
        );
        self.order.push_back(id);
        while self.order.len() > MAX_PARKED {
            if let Some(old) = self.order.pop_front() {
                self.cells.remove(&old);
            }
        }
    }

    /// Takes cell `id` to wait on.
    pub fn take(&mut self, id: u64) -> Take {
        match self.cells.get_mut(&id) {
            None => Take::Unknown,
            Some(slot) => slot.waiting.take().map_or(Take::Busy, Take::Got),
        }
    }

    /// Gives back a cell whose waiter stopped before its result came.
    pub fn put_back(&mut self, id: u64, waiting: Waiting) {
        if let Some(slot) = self.cells.get_mut(&id) {
            slot.waiting = Some(waiting);
        }
    }

    /// The ticket of cell `id`, whether or not a waiter has it.
    pub fn ticket(&self, id: u64) -> Option<Arc<Ticket>> {
        self.cells.get(&id).map(|slot| Arc::clone(&slot.ticket))
    }

    /// Forgets a collected cell.
    pub fn collected(&mut self, id: u64) {
        self.cells.remove(&id);
        self.order.retain(|&i| i != id);
    }
}
