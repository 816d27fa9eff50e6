//! Kicking a running vCPU out of `KVM_RUN` at a deadline (the timed event source's overflow).
//!
//! The cloud-hypervisor pattern: a no-op-ish `SIGRTMIN` handler sets `kvm_run.immediate_exit`
//! through a thread-local pointer, so a kick that lands while the thread is in user space
//! still makes the next `KVM_RUN` return `EINTR` at once; a kicker thread per vCPU sleeps until
//! the deadline the vCPU thread last armed and then signals it.

use std::cell::Cell;
use std::sync::Once;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

use kvm_bindings::kvm_run;
use vmm_sys_util::signal::{SIGRTMIN, register_signal_handler};

thread_local! {
    /// This thread's vCPU `kvm_run` page (null on threads without a vCPU).
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let run = KVM_RUN.with(Cell::get);
    if !run.is_null() {
        // SAFETY: the pointer was set by this thread to its own vCPU's kvm_run mapping, which
        // lives until the thread clears it (`Kick::drop`); a single byte store is
        // async-signal-safe.
        unsafe { std::ptr::write_volatile(&raw mut (*run).immediate_exit, 1) };
    }
}

/// The kicker of the calling vCPU thread.
#[derive(Debug)]
pub struct Kick {
    tx: Option<Sender<Option<Instant>>>,
    kicker: Option<JoinHandle<()>>,
}

impl Kick {
    /// Installs the signal handler (once per process), records `run` as this thread's
    /// `kvm_run` and starts the kicker thread aimed at the calling thread.
    pub fn new(run: *mut kvm_run) -> Result<Self, String> {
        static HANDLER: Once = Once::new();
        let mut error = None;
        HANDLER.call_once(|| {
            if let Err(e) = register_signal_handler(SIGRTMIN(), on_kick) {
                error = Some(format!("cannot install the kick handler: {e}"));
            }
        });
        if let Some(e) = error {
            return Err(e);
        }
        KVM_RUN.with(|c| c.set(run));
        // SAFETY: pthread_self has no preconditions.
        let target = unsafe { libc::pthread_self() };
        let (tx, rx) = mpsc::channel::<Option<Instant>>();
        let kicker = std::thread::spawn(move || {
            let mut deadline: Option<Instant> = None;
            loop {
                let message = match deadline {
                    None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    Some(d) => rx.recv_timeout(d.saturating_duration_since(Instant::now())),
                };
                match message {
                    Ok(new) => deadline = new,
                    Err(RecvTimeoutError::Timeout) => {
                        // SAFETY: `target` is the vCPU thread, alive until `Kick::drop` (on that
                        // thread) has joined this one.
                        unsafe { libc::pthread_kill(target, SIGRTMIN()) };
                        deadline = None;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
        });
        Ok(Self {
            tx: Some(tx),
            kicker: Some(kicker),
        })
    }

    /// Points the kick at `run`, the `kvm_run` page of another vCPU this same thread runs
    /// (several vCPUs time-sliced on one thread). Every page aimed at must stay mapped until
    /// this `Kick` is dropped; call it from the thread that made the `Kick`.
    pub fn retarget(&self, run: *mut kvm_run) {
        KVM_RUN.with(|c| c.set(run));
    }

    /// Kick at `deadline` (None: cancel).
    pub fn arm(&self, deadline: Option<Instant>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(deadline);
        }
    }
}

impl Drop for Kick {
    fn drop(&mut self) {
        // Disconnect, wait for the kicker (a kick in flight lands on this live thread), then
        // forget the kvm_run page.
        self.tx = None;
        if let Some(kicker) = self.kicker.take() {
            let _ = kicker.join();
        }
        KVM_RUN.with(|c| c.set(std::ptr::null_mut()));
    }
}
