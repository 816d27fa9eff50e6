//! Kicking a running vCPU out of `KVM_RUN` at a deadline (the timed event source's overflow).
//!
//! The cloud-hypervisor pattern: a no-op-ish `SIGRTMIN` handler sets `kvm_run.immediate_exit`
//! through a thread-local pointer, so a kick that lands while the thread is in user space
//! still makes the next `KVM_RUN` return `EINTR` at once; a kicker thread per vCPU sleeps until
//! the deadline the vCPU thread last armed and then signals it. Other threads kick a vCPU thread
//! through its [`KickTarget`] (a cross-CPU request for the pCPU that thread is).

use std::cell::Cell;
use std::sync::Once;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

use kvm_bindings::kvm_run;
use vmm_sys_util::signal::{SIGRTMIN, register_signal_handler};

use crate::error::MachineError;

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
    pub fn new(run: *mut kvm_run) -> Result<Self, MachineError> {
        static HANDLER: Once = Once::new();
        let mut error = None;
        HANDLER.call_once(|| {
            if let Err(e) = register_signal_handler(SIGRTMIN(), on_kick) {
                error = Some(MachineError::KickHandler(e));
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

/// Where other threads kick a thread out of `KVM_RUN`: the thread registered there now, if any.
/// Lock-free, so that a request sent from a hot path takes no lock: a kick announces itself in
/// `kicking` before it reads the thread, and `unregister` clears the thread before it waits for
/// the kicks in progress, so (all accesses sequentially consistent) no kick can signal a thread
/// that has unregistered and gone on to exit.
#[derive(Debug, Default)]
pub struct KickTarget {
    /// The registered thread's `pthread_t`, 0 for none (a `pthread_t` is never 0 on Linux: it
    /// is the address of the thread's descriptor).
    thread: AtomicU64,
    /// Kicks between their read of `thread` and their `pthread_kill`.
    kicking: AtomicU32,
}

impl KickTarget {
    /// Makes the calling thread the one kicked here. `_kick` proves that the thread has a
    /// live [`Kick`], so the signal handler is installed (SIGRTMIN's default action would end
    /// the process); the thread must call `unregister` before that `Kick` is dropped.
    pub fn register(&self, _kick: &Kick) {
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() };
        self.thread.store(me as u64, Ordering::SeqCst);
    }

    /// Stops kicking the calling thread here (nothing if another thread registered since),
    /// and waits for kicks in progress, after which none can reach it.
    pub fn unregister(&self) {
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() } as u64;
        let _ = self
            .thread
            .compare_exchange(me, 0, Ordering::SeqCst, Ordering::SeqCst);
        while self.kicking.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
    }

    /// Kicks the registered thread, if any: its `KVM_RUN` returns (or its next one returns at
    /// once) with `EINTR`.
    pub fn kick(&self) {
        self.kicking.fetch_add(1, Ordering::SeqCst);
        let thread = self.thread.load(Ordering::SeqCst);
        if thread != 0 {
            // SAFETY: a registered thread is alive until it has unregistered, and it waits in
            // `unregister` for this kick (counted in `kicking` before `thread` was read); its
            // SIGRTMIN handler is installed (`register`).
            unsafe { libc::pthread_kill(thread as libc::pthread_t, SIGRTMIN()) };
        }
        self.kicking.fetch_sub(1, Ordering::SeqCst);
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
