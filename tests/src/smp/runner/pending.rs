//! Operations that wait for other pCPUs: control operations answered `-EAGAIN` and run-time
//! event filter changes, retried until done and watched for livelock.

use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use vpmu::abi::ops::{OpError, Params};
use vpmu::{ChangeRefused, Completion, VcpuId};

use vpmu_sim::SimVendor;

use super::{OpKind, Pending, Runner};

impl<V: SimVendor> Runner<'_, V> {
    /// Starts a control operation that may have to wait for other pCPUs, and tries it once.
    pub(super) fn start_op(&mut self, caller: VcpuId, op: u32, params: Params, kind: OpKind) {
        self.pending = Some(Pending::Op {
            caller,
            op,
            params,
            kind,
            mode_before: self.vpmu.mode(),
            wait: self.waiting(),
        });
        self.retry_pending();
    }

    /// The integrator installs a new event filter for an unprivileged domain at run time.
    pub(super) fn filter_change(&mut self) {
        let domain = 1 + self.rng.below(self.shared.vcpu_counts.len() as u64 - 1) as u32;
        let filter = &self.shared.filters[domain as usize];
        if filter
            .changing
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return;
        }
        filter.generation.fetch_add(1, Ordering::SeqCst);
        let deny = !filter.deny.load(Ordering::SeqCst);
        filter.deny.store(deny, Ordering::SeqCst);
        self.note(format!(
            "filter of domain {domain}: deny instructions {deny}"
        ));
        self.pending = Some(Pending::Filter {
            domain,
            committed: false,
            wait: self.waiting(),
        });
        self.retry_pending();
    }

    pub(super) fn retry_pending(&mut self) {
        let Some(mut pending) = self.pending.take() else {
            return;
        };
        match pending {
            Pending::Op {
                caller,
                op,
                params,
                kind,
                mode_before,
                ref mut wait,
            } => {
                let changes = matches!(kind, OpKind::ModeSet { .. } | OpKind::FeatureSet { .. });
                let shared = self.shared;
                let gate = (changes && shared.avoid_known_bugs).then(|| {
                    shared
                        .policy_gate
                        .write()
                        .unwrap_or_else(PoisonError::into_inner)
                });
                let result = self.op(caller, op, &params);
                drop(gate);
                if result == Err(OpError::Again) {
                    let what = format!("{kind:?} by {caller:?}");
                    self.check_livelock(wait, &what);
                    self.shared.coverage.hit("operations answered -EAGAIN");
                    self.pending = Some(pending);
                    return;
                }
                self.check_op(caller, kind, mode_before, result.map(|_| ()));
            }
            Pending::Filter {
                domain,
                committed,
                ref mut wait,
            } => {
                let done = if committed {
                    !self.vpmu.change_in_progress()
                } else {
                    let shared = self.shared;
                    let gate = shared.avoid_known_bugs.then(|| {
                        shared
                            .policy_gate
                            .write()
                            .unwrap_or_else(PoisonError::into_inner)
                    });
                    let result = self.vpmu.event_filter_changed(
                        &mut self.platform,
                        &mut self.pcpu,
                        self.table,
                    );
                    drop(gate);
                    match result {
                        Ok(Completion::Done) => true,
                        Ok(Completion::Pending) => {
                            self.pending = Some(Pending::Filter {
                                domain,
                                committed: true,
                                wait: wait.clone(),
                            });
                            return;
                        }
                        Err(ChangeRefused::InProgress) => false,
                        Err(ChangeRefused::InUse) => {
                            self.find("filter change refused as in use", String::new());
                            true
                        }
                        Err(ChangeRefused::Fault(e)) => {
                            self.core_ok("event_filter_changed", Err(e))
                        }
                    }
                };
                if done {
                    let filter = &self.shared.filters[domain as usize];
                    filter.generation.fetch_add(1, Ordering::SeqCst);
                    filter.changing.store(false, Ordering::SeqCst);
                    self.note(format!("filter of domain {domain} in force"));
                    self.shared.coverage.hit("filter changes completed");
                } else {
                    self.check_livelock(wait, "an event filter change");
                    self.pending = Some(pending);
                }
            }
        }
    }
}
