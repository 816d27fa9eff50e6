//! The barrier vCPU threads meet at for a migration.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::count_shared_lock;
use crate::error::{MachineError, Result};

/// How long a vCPU waits for the others at a migration before giving up.
pub(crate) const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(10);

/// A reusable barrier that gives up after a timeout (a vCPU that died never arrives).
pub(super) struct Rendezvous {
    count: usize,
    /// Generation and arrivals in it.
    state: Mutex<(u64, usize)>,
    all_arrived: Condvar,
}

impl Rendezvous {
    pub(super) fn new(count: usize) -> Self {
        Self {
            count,
            state: Mutex::new((0, 0)),
            all_arrived: Condvar::new(),
        }
    }

    pub(super) fn wait(&self, timeout: Duration) -> Result<()> {
        let poisoned = |_| MachineError::Rendezvous("rendezvous lock poisoned");
        count_shared_lock();
        let mut state = self.state.lock().map_err(poisoned)?;
        let generation = state.0;
        state.1 += 1;
        if state.1 == self.count {
            *state = (generation + 1, 0);
            self.all_arrived.notify_all();
            return Ok(());
        }
        let (state, _) = self
            .all_arrived
            .wait_timeout_while(state, timeout, |s| s.0 == generation)
            .map_err(|_| MachineError::Rendezvous("rendezvous lock poisoned"))?;
        if state.0 == generation {
            return Err(MachineError::Rendezvous(
                "another vCPU never reached the rendezvous",
            ));
        }
        Ok(())
    }
}
