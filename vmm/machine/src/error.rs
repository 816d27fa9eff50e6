//! The machine's error type: what went wrong setting up or running a guest, naming the KVM
//! ioctl, the memory range, the guest program or the guest protocol violation at fault.

use std::time::Duration;

use crate::loader::LoadError;

/// Why the machine could not set up or run a guest.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MachineError {
    /// The KVM device could not be opened.
    #[error("cannot open {path}: {source}")]
    OpenDevice {
        /// The device's path.
        path: String,
        /// What `open` said.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The device path has a NUL byte in it.
    #[error("the KVM device path {0:?} contains a NUL byte")]
    DevicePath(String),
    /// The device opened but does not answer `KVM_GET_API_VERSION` as KVM does (`/dev/null`, a
    /// regular file...).
    #[error("{}{path} is not a KVM device", if *.from_env { "VPMU_KVM_DEVICE=" } else { "" })]
    NotKvm {
        /// The device's path.
        path: String,
        /// The path came from `$VPMU_KVM_DEVICE`.
        from_env: bool,
    },
    /// KVM lacks a capability the machine needs.
    #[error("KVM lacks {0:?}")]
    MissingCapability(kvm_ioctls::Cap),
    /// A KVM ioctl failed.
    #[error("{ioctl}: {source}")]
    Kvm {
        /// Which ioctl (or which step of the setup made it).
        ioctl: &'static str,
        /// The errno.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// Guest RAM could not be allocated.
    #[error("cannot allocate {len:#x} bytes of guest memory: {source}")]
    MemoryAllocation {
        /// The size asked for.
        len: usize,
        /// What vm-memory said.
        #[source]
        source: vm_memory::mmap::FromRangesError,
    },
    /// An access to guest memory outside guest RAM.
    #[error("[{gpa:#x}, {gpa:#x} + {len:#x}) is outside guest memory")]
    OutsideMemory {
        /// The guest-physical address.
        gpa: u64,
        /// The length of the access.
        len: usize,
    },
    /// The guest program could not be loaded.
    #[error("cannot load the guest program: {0}")]
    Load(#[from] LoadError),
    /// A layout with a domain id the ABI reserves (`XENPMU_DOMID_FIRST_RESERVED` and up): its
    /// samples would read as `XENPMU_DOMID_SELF` or `XENPMU_DOMID_HYPERVISOR`.
    #[error(
        "domain {domain:#x} is a reserved domain id (ids from {:#x} are reserved)",
        vpmu::abi::XENPMU_DOMID_FIRST_RESERVED
    )]
    ReservedDomain {
        /// The first domain id of the layout that is reserved.
        domain: u32,
    },
    /// A call into the vpmu core failed (a VMM or core bug, not the guest's doing).
    #[error("{call}: {error:?}")]
    Core {
        /// The core's entry point.
        call: &'static str,
        /// The core's error.
        error: vpmu::CoreError,
    },
    /// Completing a request another pCPU sent failed (a VMM or core bug).
    #[error("complete_request {request:?}: {error:?}")]
    Request {
        /// The request.
        request: vpmu::CrossCpuRequest,
        /// The core's error.
        error: vpmu::CoreError,
    },
    /// The kick signal handler could not be installed.
    #[error("cannot install the kick handler: {0}")]
    KickHandler(#[source] vmm_sys_util::errno::Error),
    /// The vCPU ran past the run's timeout.
    #[error("timeout after {0:?}")]
    Timeout(Duration),
    /// `KVM_RUN` exited for a reason the machine does not handle.
    #[error("boot image: {0}")]
    Boot(String),
    #[error("unexpected exit {0}")]
    UnexpectedExit(String),
    /// A guest asked for something its layout cannot do (the guest protocol of `port`).
    #[error("guest protocol: {0}")]
    GuestProtocol(&'static str),
    /// The vCPU threads' rendezvous of a migration failed.
    #[error("{0}")]
    Rendezvous(&'static str),
    /// A migration could not switch the vCPU off its pCPU.
    #[error("migration off pCPU {from}: {source}")]
    MigrationOff {
        /// The pCPU it was leaving.
        from: u32,
        /// Why.
        #[source]
        source: Box<MachineError>,
    },
    /// A migration found the next pCPU not parked.
    #[error("migration: pCPU {0} was not handed over")]
    NotHandedOver(u32),
    /// A migration could not switch the vCPU onto its new pCPU.
    #[error("migration onto pCPU {to}: {error:?}")]
    MigrationOnto {
        /// The new pCPU.
        to: u32,
        /// The core's error.
        error: vpmu::CoreError,
    },
    /// A write to the MMIO port window the window refuses (`window`).
    #[error("MMIO port window: {0}")]
    Window(String),
    /// The consumer's port extension (`GuestPorts`) refused a guest's `outl`.
    #[error("port {port:#x} <- {value:#x}: {message}")]
    Port {
        /// The port.
        port: u16,
        /// The value written.
        value: u32,
        /// The extension's error.
        message: String,
    },
}

impl MachineError {
    /// A KVM ioctl failure (for `map_err`).
    pub(crate) fn kvm(ioctl: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Self {
        move |source| Self::Kvm { ioctl, source }
    }
}

/// The machine's results.
pub type Result<T, E = MachineError> = std::result::Result<T, E>;
