//! The spare sandbox slot: at most one sandbox started ahead of need, so
//! that the next execution after a reset, a failure or the first one does
//! not wait for a start.
//!
//! A start is claimed with a ticket; only the start that holds the
//! slot's current ticket may fill it, so a start that was discarded
//! meanwhile (the mounts changed, the session ended) can never put its
//! sandbox there. Generic over the sandbox type: what a sandbox is, and
//! how it is started and killed, is not this module's business.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::outcome::SpareState;

enum Slot<W> {
    Empty,
    /// A start is under way: its ticket.
    Starting(u64),
    Ready(Box<W>),
}

pub struct Spare<W> {
    slot: parking_lot::Mutex<Slot<W>>,
    tickets: AtomicU64,
}

impl<W> Default for Spare<W> {
    fn default() -> Self {
        Spare { slot: parking_lot::Mutex::new(Slot::Empty), tickets: AtomicU64::new(0) }
    }
}

impl<W> Spare<W> {
    pub fn state(&self) -> SpareState {
        match *self.slot.lock() {
            Slot::Empty => SpareState::None,
            Slot::Starting(_) => SpareState::Starting,
            Slot::Ready(_) => SpareState::Ready,
        }
    }

    /// Claim the empty slot for a new start: its ticket, or `None` when
    /// the slot is not empty.
    pub fn begin(&self) -> Option<u64> {
        let mut slot = self.slot.lock();
        if !matches!(*slot, Slot::Empty) {
            return None;
        }
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        *slot = Slot::Starting(ticket);
        Some(ticket)
    }

    /// Whether the slot still waits for the start holding `ticket`.
    pub fn is_current(&self, ticket: u64) -> bool {
        matches!(*self.slot.lock(), Slot::Starting(t) if t == ticket)
    }

    /// The start holding `ticket` made nothing usable: the slot is empty
    /// again if it still waited for it.
    pub fn abandon(&self, ticket: u64) {
        let mut slot = self.slot.lock();
        if matches!(*slot, Slot::Starting(t) if t == ticket) {
            *slot = Slot::Empty;
        }
    }

    /// Put the sandbox the start holding `ticket` made into the slot; gives
    /// it back when the slot no longer waits for that start.
    pub fn fill(&self, ticket: u64, sandbox: W) -> Result<(), W> {
        let mut slot = self.slot.lock();
        if matches!(*slot, Slot::Starting(t) if t == ticket) {
            *slot = Slot::Ready(Box::new(sandbox));
            Ok(())
        } else {
            Err(sandbox)
        }
    }

    /// The ready sandbox, leaving the slot empty.
    pub fn take(&self) -> Option<Box<W>> {
        let mut slot = self.slot.lock();
        if !matches!(*slot, Slot::Ready(_)) {
            return None;
        }
        match std::mem::replace(&mut *slot, Slot::Empty) {
            Slot::Ready(w) => Some(w),
            Slot::Empty | Slot::Starting(_) => None,
        }
    }

    /// Empty the slot: the ready sandbox, if there was one. A start under
    /// way is forgotten (it can no longer fill the slot).
    pub fn clear(&self) -> Option<Box<W>> {
        match std::mem::replace(&mut *self.slot.lock(), Slot::Empty) {
            Slot::Ready(w) => Some(w),
            Slot::Empty | Slot::Starting(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_current_start_fills_the_slot() {
        let spare: Spare<&str> = Spare::default();
        assert_eq!(spare.state(), SpareState::None);
        let first = spare.begin().expect("empty");
        assert!(spare.begin().is_none(), "one start at a time");
        assert_eq!(spare.state(), SpareState::Starting);
        // Discarded while it started (a mode change): a new start replaces it.
        assert!(spare.clear().is_none());
        let second = spare.begin().expect("empty again");
        assert_eq!(spare.fill(first, "old"), Err("old"), "a discarded start must not fill the slot");
        assert!(spare.is_current(second) && !spare.is_current(first));
        spare.abandon(first);
        assert_eq!(spare.state(), SpareState::Starting, "abandoning a stale ticket changes nothing");
        assert_eq!(spare.fill(second, "new"), Ok(()));
        assert_eq!(spare.state(), SpareState::Ready);
        assert!(spare.begin().is_none());
        assert_eq!(spare.take().map(|w| *w), Some("new"));
        assert!(spare.take().is_none());
        let third = spare.begin().expect("empty");
        spare.abandon(third);
        assert_eq!(spare.state(), SpareState::None);
    }
}
