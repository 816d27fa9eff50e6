//! What the sampler guests ship to the VMM: samples as read from a xenpmu page, resolved to
//! who they belong to.

use serde::Serialize;
use vpmu::abi::{
    Regs, XENPMU_CALLCHAIN_MAX, XENPMU_CHAIN_BAD_FRAME, XENPMU_CHAIN_COMPLETE, XENPMU_CHAIN_NONE,
    XENPMU_CHAIN_TRUNCATED, XENPMU_CHAIN_UNREADABLE,
};

/// Whose execution a sample caught. Serialized in one shape for both kinds:
/// `{"kind": "domain", "domain": 1}`, `{"kind": "hypervisor", "domain": null}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Origin {
    /// A guest domain (by domain number; `XENPMU_DOMID_SELF` already resolved to the
    /// shipping domain).
    Domain(u32),
    /// The hypervisor (here: the VMM handling a guest's exit), `XENPMU_DOMID_HYPERVISOR`.
    Hypervisor,
}

impl Origin {
    /// `dom<n>` or `hypervisor`: the name every output gives this origin.
    pub fn tag(self) -> String {
        match self {
            Origin::Domain(n) => format!("dom{n}"),
            Origin::Hypervisor => "hypervisor".to_string(),
        }
    }
}

impl Serialize for Origin {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("Origin", 2)?;
        match self {
            Origin::Domain(n) => {
                s.serialize_field("kind", "domain")?;
                s.serialize_field("domain", &Some(*n))?;
            }
            Origin::Hypervisor => {
                s.serialize_field("kind", "hypervisor")?;
                s.serialize_field("domain", &None::<u32>)?;
            }
        }
        s.end()
    }
}

/// Why a sample's call chain ends where it does (`XENPMU_CHAIN_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChainEnd {
    /// No chain was walked (`XENPMU_CHAIN_NONE`).
    #[default]
    None,
    /// The walk reached the outermost frame (`XENPMU_CHAIN_COMPLETE`).
    Complete,
    /// Deeper than `XENPMU_CALLCHAIN_MAX` (`XENPMU_CHAIN_TRUNCATED`).
    Truncated,
    /// A frame pointer that cannot be one (`XENPMU_CHAIN_BAD_FRAME`).
    BadFrame,
    /// A frame the hypervisor could not read (`XENPMU_CHAIN_UNREADABLE`).
    Unreadable,
}

impl ChainEnd {
    /// The reason of a raw `chain_end`, if it is one.
    pub fn from_raw(raw: u32) -> Option<ChainEnd> {
        Some(match raw {
            XENPMU_CHAIN_NONE => ChainEnd::None,
            XENPMU_CHAIN_COMPLETE => ChainEnd::Complete,
            XENPMU_CHAIN_TRUNCATED => ChainEnd::Truncated,
            XENPMU_CHAIN_BAD_FRAME => ChainEnd::BadFrame,
            XENPMU_CHAIN_UNREADABLE => ChainEnd::Unreadable,
            _ => return None,
        })
    }
}

/// A sample's call chain: return addresses, innermost caller first (the function the sample
/// is in is `ProfileSample::rip`'s), and why it ends there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallChain {
    len: u8,
    end: ChainEnd,
    addresses: [u64; XENPMU_CALLCHAIN_MAX],
}

impl Default for CallChain {
    fn default() -> Self {
        CallChain {
            len: 0,
            end: ChainEnd::None,
            addresses: [0; XENPMU_CALLCHAIN_MAX],
        }
    }
}

impl CallChain {
    /// A chain of `addresses` ending for `end`; None if longer than `XENPMU_CALLCHAIN_MAX`
    /// or if `end` is `None` with addresses.
    pub fn new(addresses: &[u64], end: ChainEnd) -> Option<CallChain> {
        if addresses.len() > XENPMU_CALLCHAIN_MAX
            || (end == ChainEnd::None && !addresses.is_empty())
        {
            return None;
        }
        let mut chain = CallChain {
            len: addresses.len() as u8,
            end,
            ..CallChain::default()
        };
        chain.addresses[..addresses.len()].copy_from_slice(addresses);
        Some(chain)
    }

    /// The return addresses, innermost caller first.
    pub fn addresses(&self) -> &[u64] {
        &self.addresses[..usize::from(self.len)]
    }

    /// Why the chain ends.
    pub fn end(&self) -> ChainEnd {
        self.end
    }
}

/// What ABI 1.2 adds to a sample: when it was taken, its place in its page's sequence, what
/// overflowed, and its call chain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleDetails {
    /// The host TSC at the PMI (0: unknown).
    pub tsc: u64,
    /// The TSC frequency, kHz (0: unknown).
    pub tsc_khz: u64,
    /// The page's sequence number of this sample (counts dropped samples too).
    pub sequence: u64,
    /// The counters whose overflow raised the PMI (GLOBAL_STATUS bit layout).
    pub overflowed: u64,
    /// The call chain the hypervisor walked.
    pub chain: CallChain,
}

impl SampleDetails {
    /// The TSC as nanoseconds (`tsc` / `tsc_khz`), or None when either is unknown.
    pub fn time_ns(&self) -> Option<u64> {
        (self.tsc != 0 && self.tsc_khz != 0)
            .then(|| (u128::from(self.tsc) * 1_000_000 / u128::from(self.tsc_khz)) as u64)
    }
}

/// One sample, as a sampler guest read it from its page and shipped it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileSample {
    /// Whose execution it caught.
    pub origin: Origin,
    /// The vCPU it caught (of `origin`'s domain; for the hypervisor, the vCPU it served).
    pub vcpu: u32,
    /// The pCPU it was taken on (as the page told the privileged domain).
    pub pcpu: u32,
    /// The interrupted instruction pointer.
    pub rip: u64,
    /// Taken at CPL3 (`XENPMU_FLAG_SAMPLE_USER`).
    pub user: bool,
    /// The full interrupted register set from the page.
    pub regs: Regs,
    /// The domain whose guest shipped it (the profiler in all/hv mode, the domain itself in
    /// self mode).
    pub shipped_by: u32,
    /// Time, sequence, overflowed counters and call chain (ABI 1.2).
    pub details: SampleDetails,
}
