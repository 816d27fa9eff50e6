//! Kicking a running vCPU out of `KVM_RUN` at a deadline (the timed event source's overflow).
//!
//! The cloud-hypervisor pattern: a no-op-ish `SIGRTMIN` handler sets `kvm_run.immediate_exit`
//! through a thread-local pointer, so a kick that lands while the thread is in user space
//! still makes the next `KVM_RUN` return `EINTR` at once. The deadline is a POSIX timer of the
//! vCPU thread itself (`timer_create` with `SIGEV_THREAD_ID`): the kernel's high-resolution
//! timer signals the thread from the interrupt on the CPU it runs on, so the kick lands within
//! microseconds of the deadline whatever else the host runs. (A kicker thread that sleeps until
//! the deadline must itself be scheduled first: 170–270 µs late on this host, milliseconds
//! under load, and the guest runs on all that time past its counter's overflow.) Other threads
//! kick a vCPU thread through its [`KickTarget`] (a cross-CPU request for the pCPU that thread
//! is).

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Once;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use kvm_bindings::kvm_run;
use vmm_sys_util::signal::{SIGRTMIN, register_signal_handler};

use crate::error::MachineError;
use crate::host::Host;

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

/// The kicker of the calling vCPU thread: its deadline timer. Not `Send`: the timer signals
/// the thread that made it.
#[derive(Debug)]
pub struct Kick {
    timer: libc::timer_t,
    _thread_bound: PhantomData<*const ()>,
}

impl Kick {
    /// Installs the signal handler (once per process), records `run` as this thread's
    /// `kvm_run` and creates the deadline timer aimed at the calling thread.
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
        // SAFETY: an all-zero sigevent is valid; the fields that matter are set below.
        let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = SIGRTMIN();
        // SAFETY: gettid has no preconditions.
        event.sigev_notify_thread_id = unsafe { libc::gettid() };
        let mut timer: libc::timer_t = std::ptr::null_mut();
        // SAFETY: both pointers are valid for the call; the timer is deleted in `drop`.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &raw mut event, &raw mut timer) } != 0
        {
            return Err(MachineError::KickHandler(vmm_sys_util::errno::Error::last()));
        }
        KVM_RUN.with(|c| c.set(run));
        Ok(Self {
            timer,
            _thread_bound: PhantomData,
        })
    }

    /// Points the kick at `run`, the `kvm_run` page of another vCPU this same thread runs
    /// (several vCPUs time-sliced on one thread). Every page aimed at must stay mapped until
    /// this `Kick` is dropped; call it from the thread that made the `Kick`.
    pub fn retarget(&self, run: *mut kvm_run) {
        KVM_RUN.with(|c| c.set(run));
    }

    /// Kick at `deadline` (None: cancel; a deadline already past kicks at once).
    pub fn arm(&self, deadline: Option<Instant>) {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        // An all-zero it_value disarms: a deadline that has passed is 1 ns away.
        let (sec, nsec) = left.map_or((0, 0), |l| {
            if l.is_zero() {
                (0, 1)
            } else {
                (
                    l.as_secs() as libc::time_t,
                    libc::c_long::from(l.subsec_nanos()),
                )
            }
        });
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: sec,
                tv_nsec: nsec,
            },
        };
        // SAFETY: the timer lives until `drop`; `spec` is valid for the call.
        unsafe { libc::timer_settime(self.timer, 0, &raw const spec, std::ptr::null_mut()) };
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
        // Delete the timer (a signal already sent lands on this live thread, whose handler
        // is installed for the process), then forget the kvm_run page.
        // SAFETY: the timer was created by `new` and is deleted once.
        unsafe { libc::timer_delete(self.timer) };
        KVM_RUN.with(|c| c.set(std::ptr::null_mut()));
    }
}

/// The kicker of a pCPU thread, also registered as the kick target of the pCPU the thread is
/// (`Host::mailboxes`), so that requests from other pCPUs bring it out of `KVM_RUN`.
pub(crate) struct ThreadKick<'h> {
    kick: Kick,
    host: &'h Host,
}

impl<'h> ThreadKick<'h> {
    pub(crate) fn new(run: *mut kvm_run, host: &'h Host) -> crate::error::Result<Self> {
        Ok(Self {
            kick: Kick::new(run)?,
            host,
        })
    }

    /// This thread is now pCPU `pcpu`.
    pub(crate) fn register(&self, pcpu: u32) {
        if let Some(m) = self.host.mailboxes.get(pcpu as usize) {
            m.kick.register(&self.kick);
        }
    }

    /// This thread is no longer pCPU `pcpu`.
    pub(crate) fn unregister(&self, pcpu: u32) {
        if let Some(m) = self.host.mailboxes.get(pcpu as usize) {
            m.kick.unregister();
        }
    }

    pub(crate) fn kick(&self) -> &Kick {
        &self.kick
    }
}

impl Drop for ThreadKick<'_> {
    fn drop(&mut self) {
        // Before the thread can end: no kick may target it afterwards.
        for m in &self.host.mailboxes {
            m.kick.unregister();
        }
    }
}
