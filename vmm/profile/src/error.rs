//! Why `vpmu profile` could not run or finish (a failed check is a result, not an error).

use std::path::PathBuf;

use vpmu_machine::MachineError;
use vpmu_machine::symbols::SymbolError;

use crate::protocol::DecodeError;

/// Why a profile run could not be made or finished.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// KVM's supported CPUID could not be read.
    #[error("KVM CPUID: {0}")]
    Cpuid(#[source] MachineError),
    /// The machine could not be made.
    #[error("VM setup failed: {0}")]
    Setup(#[source] MachineError),
    /// KVM did not report the TSC frequency the periods are computed from.
    #[error("KVM reports no TSC frequency")]
    NoTscFrequency,
    /// A `--guest` image could not be read.
    #[error("--guest {}: {source}", path.display())]
    GuestUnreadable {
        /// The image's path.
        path: PathBuf,
        /// What reading it said.
        #[source]
        source: std::io::Error,
    },
    /// A `--guest` image cannot be symbolized (not an ELF, no symbol table...).
    #[error("--guest {}: {source}", path.display())]
    GuestSymbols {
        /// The image's path.
        path: PathBuf,
        /// What the symbol reader said.
        #[source]
        source: SymbolError,
    },
    /// An image's symbol table could not be read while configuring it.
    #[error("domain {domain}: {source}")]
    Symbols {
        /// The domain whose image it is.
        domain: u32,
        /// What the symbol reader said.
        #[source]
        source: SymbolError,
    },
    /// An image's `profile_config` has another size than the protocol's.
    #[error("domain {domain}: `profile_config` is {size} bytes, the protocol's is {want}")]
    ConfigSize {
        /// The domain whose image it is.
        domain: u32,
        /// The symbol's size.
        size: u64,
        /// `struct profile_config`'s size.
        want: usize,
    },
    /// A symbol the VMM writes or reads is not in guest RAM.
    #[error("domain {domain}: `{symbol}` at {gpa:#x} is not in RAM")]
    SymbolOutsideRam {
        /// The domain.
        domain: u32,
        /// The symbol.
        symbol: &'static str,
        /// Its address.
        gpa: u64,
    },
    /// A file of the Linux profiling domain (`--profiler linux`) could not be read.
    #[error(
        "--profiler linux: {}: {source} (build the guest with vmm/linux-guest/build.sh, or \
         name its directory with --linux-guest)",
        path.display()
    )]
    LinuxGuest {
        /// The file.
        path: PathBuf,
        /// What reading it said.
        #[source]
        source: std::io::Error,
    },
    /// The Linux domain's vCPU has another TSC frequency than the probe the counter period on
    /// its command line was computed from.
    #[error("the TSC frequency changed: {probe} kHz in a probe vCPU, {vcpu:?} in the run's")]
    TscChanged {
        /// The probe's (kHz).
        probe: u64,
        /// The run's first vCPU's (kHz).
        vcpu: Option<u64>,
    },
    /// The machine has no such domain.
    #[error("no domain {0} in the machine")]
    NoSuchDomain(u32),
    /// The profiler image does not take part in the protocol.
    #[error("the profiler image has no profile_config")]
    NoProfilerConfig,
    /// The machine returned a result without its vCPU.
    #[error("a vCPU result without its vCPU")]
    AnonymousResult,
    /// A vCPU's run broke.
    #[error("{who} failed: {error}\n{console}")]
    VcpuFailed {
        /// Which vCPU (`domain D vCPU V`).
        who: String,
        /// The run's error.
        error: String,
        /// Its console, indented.
        console: String,
    },
    /// A vCPU exited with a non-zero status (its guest's checks failed).
    #[error("{who} exited with status {status:?}\n{console}")]
    VcpuStatus {
        /// Which vCPU (`domain D vCPU V`).
        who: String,
        /// The status (None: stopped without one).
        status: Option<u32>,
        /// Its console, indented.
        console: String,
    },
    /// A guest shipped a malformed batch.
    #[error(transparent)]
    Batch(#[from] DecodeError),
    /// The output directory could not be made.
    #[error("--out {}: {source}", path.display())]
    OutDir {
        /// The directory.
        path: PathBuf,
        /// What creating it said.
        #[source]
        source: std::io::Error,
    },
    /// An output file could not be written.
    #[error("{}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What writing it said.
        #[source]
        source: std::io::Error,
    },
    /// A JSON document could not be serialized.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl ProfileError {
    /// A write failure of `path` (for `map_err`).
    pub(crate) fn write(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Write { path, source }
    }
}
