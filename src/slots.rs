//! A model server's request slots (SPEC §3): a lease per model call, first come first served, with top-level sessions ahead of sub-agents.
//!
//! Why per request and not per child run: a child that waits for an approval, runs a
//! command or waits for its own children holds no slot, so a one-request server (Ollama,
//! LM Studio, `max_concurrent: 1`) serves the parent's next call as soon as the current
//! request ends, and a parent never waits for its children's whole runs. Top-level
//! sessions go first because the person is waiting on them; among each kind the order
//! is the order of asking.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The slots of one server.
pub struct RequestSlots {
    total: usize,
    inner: Mutex<Inner>,
}

struct Inner {
    free: usize,
    top: VecDeque<oneshot::Sender<Permit>>,
    children: VecDeque<oneshot::Sender<Permit>>,
}

/// One request's slot; dropping it hands the slot to the next in line.
pub struct Permit {
    slots: Option<Arc<RequestSlots>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            slots.release();
        }
    }
}

impl RequestSlots {
    pub fn new(total: usize) -> Arc<Self> {
        let total = total.max(1);
        Arc::new(RequestSlots {
            total,
            inner: Mutex::new(Inner {
                free: total,
                top: VecDeque::new(),
                children: VecDeque::new(),
            }),
        })
    }

    /// How many requests the server takes at once.
    pub fn total(&self) -> usize {
        self.total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot, at once when one is free and nobody waits ahead; otherwise `waiting` is told
    /// how many are ahead, and the slot comes in turn. Dropping the future gives up the
    /// place in line (a slot handed to it meanwhile goes on to the next).
    pub async fn acquire(self: &Arc<Self>, top: bool, waiting: impl FnOnce(usize)) -> Permit {
        let rx = {
            let mut inner = self.lock();
            let ahead = if top {
                inner.top.len()
            } else {
                inner.top.len() + inner.children.len()
            };
            if inner.free > 0 && ahead == 0 {
                inner.free -= 1;
                return Permit {
                    slots: Some(self.clone()),
                };
            }
            let (tx, rx) = oneshot::channel();
            if top {
                inner.top.push_back(tx);
            } else {
                inner.children.push_back(tx);
            }
            drop(inner);
            waiting(ahead);
            rx
        };
        match rx.await {
            Ok(permit) => permit,
            // Unreachable while `self` lives (only `release` drops a sender, after sending);
            // a fresh permit keeps the count right in any case.
            Err(_) => {
                let mut inner = self.lock();
                inner.free = inner.free.saturating_sub(1);
                Permit {
                    slots: Some(self.clone()),
                }
            }
        }
    }

    /// Hands a freed slot to the next waiter still waiting, else counts it free.
    fn release(self: &Arc<Self>) {
        loop {
            let next = {
                let mut inner = self.lock();
                match inner.top.pop_front().or_else(|| inner.children.pop_front()) {
                    Some(next) => next,
                    None => {
                        inner.free = (inner.free + 1).min(self.total);
                        return;
                    }
                }
            };
            let permit = Permit {
                slots: Some(self.clone()),
            };
            match next.send(permit) {
                Ok(()) => return,
                // That waiter gave up: disarm the permit and try the next one.
                Err(mut permit) => {
                    permit.slots = None;
                }
            }
        }
    }

    /// Slots free now (for tests and the status line).
    pub fn free(&self) -> usize {
        self.lock().free
    }

    /// No request holds a slot or waits for one.
    pub fn idle(&self) -> bool {
        let inner = self.lock();
        inner.free == self.total && inner.top.is_empty() && inner.children.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn top_level_requests_go_ahead_of_children_and_each_kind_in_order() {
        let slots = RequestSlots::new(1);
        let held = slots.acquire(true, |_| {}).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for (name, top) in [("child-1", false), ("child-2", false), ("top", true)] {
            let slots = slots.clone();
            let order = order.clone();
            let (queued_tx, queued_rx) = oneshot::channel();
            waiters.push(tokio::spawn(async move {
                let permit = slots
                    .acquire(top, move |ahead| {
                        let _ = queued_tx.send(ahead);
                    })
                    .await;
                order.lock().unwrap_or_else(|p| p.into_inner()).push(name);
                drop(permit);
            }));
            // Each is in line before the next asks.
            assert!(queued_rx.await.is_ok());
        }
        drop(held);
        for waiter in waiters {
            assert!(waiter.await.is_ok());
        }
        let order = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(order, vec!["top", "child-1", "child-2"]);
        assert_eq!(slots.free(), 1);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_passes_its_slot_on() {
        let slots = RequestSlots::new(1);
        let held = slots.acquire(false, |_| {}).await;
        let gave_up = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire(false, |_| {}).await })
        };
        tokio::task::yield_now().await;
        gave_up.abort();
        let _ = gave_up.await;
        drop(held);
        // The slot is free again, not lost to the waiter that left.
        let again = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            slots.acquire(false, |_| {}),
        )
        .await;
        assert!(again.is_ok());
    }
}
