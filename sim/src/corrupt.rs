//! Certainly-invalid vendor areas, for the corrupted-page tests: which values each vendor's
//! rules refuse at flush, reasoned from the vendor documentation (SDM, APM) independently of
//! the backends' validators.

use vpmu::abi::{AmdBanks, IntelBanks, VendorArea};

use super::vendor::Driver;

impl Driver {
    /// Makes `area` certainly invalid for verification at flush by setting, in the register
    /// `pick` selects, a bit the vendor's rules refuse for a guest with no features
    /// (reasoned from the vendor documentation, independently of the backends). AMD HostOnly
    /// is among the choices unless `host_allowed` (the privileged profiler in hv/all mode).
    /// `sample_status` is the overflow status the hypervisor wrote with the sample: setting a
    /// status bit outside it is "inventing an overflow". Returns the register's name.
    pub fn make_invalid(
        &self,
        area: &mut VendorArea,
        sample_status: u64,
        host_allowed: bool,
        pick: u32,
        bit: u32,
    ) -> &'static str {
        // Words of the fixed part: 2 global_ctrl, 3 global_status, 4 ovf_ctrl (Intel),
        // 5 fixed_ctrl, 6 ds_area, 7 pebs_enable; banks from word 8.
        let free_status_bit = (0..64)
            .map(|b| (bit + b) % 64)
            .find(|b| sample_status & (1 << b) == 0)
            .expect("some status bit is clear");
        match *self {
            Driver::Intel { gp, fixed, .. } => {
                let banks = IntelBanks::new(32 - fixed.leading_zeros(), gp).expect("fits");
                let counters = ((1u64 << gp) - 1) | u64::from(fixed) << 32;
                let outside = (0..64)
                    .map(|b| (bit + b) % 64)
                    .find(|b| counters & (1 << b) == 0)
                    .expect("a non-counter bit");
                match pick % 8 {
                    0 => {
                        // A GP counter takes any value (as IA32_PMCx does); a fixed counter
                        // refuses bits above its width.
                        let index = fixed.trailing_zeros() as usize;
                        let value = banks.fixed_counter(area, index).expect("fixed");
                        let value = value | 1 << (48 + bit % 16);
                        banks.set_fixed_counter(area, index, value).expect("fixed");
                        "fixed counter above the width"
                    }
                    1 => {
                        let index = (bit % gp) as usize;
                        let reserved = [19, 21].into_iter().chain(32..64).collect::<Vec<_>>();
                        let mut pair = banks.pair(area, index).expect("gp");
                        pair.control |= 1 << reserved[(bit as usize) % reserved.len()];
                        banks.set_pair(area, index, pair).expect("gp");
                        "evtsel reserved/AnyThread/PinControl bit"
                    }
                    2 => {
                        area.words[2] |= 1 << outside;
                        "global_ctrl bit of an absent counter"
                    }
                    3 => {
                        // AnyThread (nibble bit 2) of a present fixed counter.
                        area.words[5] |= 1 << (4 * fixed.trailing_zeros() + 2);
                        "fixed_ctrl AnyThread"
                    }
                    4 => {
                        area.words[3] |= 1 << free_status_bit;
                        "global_status bit the hypervisor did not set"
                    }
                    5 => {
                        area.words[4] |= 1 << 61;
                        "global_ovf_ctrl uncore bit"
                    }
                    6 => {
                        area.words[7] |= 1 << (bit % 64);
                        "pebs_enable non-zero"
                    }
                    _ => {
                        area.words[6] |= 0x1000 << (bit % 20);
                        "ds_area without the BTS feature"
                    }
                }
            }
            Driver::Amd { counters, v2, .. } => {
                let banks = AmdBanks::new(counters).expect("fits");
                let index = (bit % counters) as usize;
                match pick % 4 {
                    0 => {
                        // Counters take any value (bits above 47 dropped, as WRMSR does): a
                        // reserved control bit of the upper half instead.
                        let value = banks.ctrl(area, index).expect("bank");
                        let value = value | 1 << (42 + bit % 22);
                        banks.set_ctrl(area, index, value).expect("bank");
                        "ctrl reserved bit 63:42"
                    }
                    1 => {
                        // Reserved: 63:42, 39:36, 21, 19; HostOnly (41) for a guest.
                        let host_only = (!host_allowed).then_some(41);
                        let reserved: Vec<u32> = [19, 21, 36, 37, 38, 39]
                            .into_iter()
                            .chain(host_only)
                            .chain(42..64)
                            .collect();
                        let value = banks.ctrl(area, index).expect("bank");
                        let value = value | 1 << reserved[(bit as usize) % reserved.len()];
                        banks.set_ctrl(area, index, value).expect("bank");
                        "ctrl reserved or HostOnly bit"
                    }
                    2 => {
                        area.words[2] |= if v2 {
                            1 << (counters + bit % (64 - counters))
                        } else {
                            1 << (bit % 64)
                        };
                        "global_ctrl bit of an absent counter"
                    }
                    _ => {
                        area.words[3] |= if v2 {
                            1 << free_status_bit
                        } else {
                            1 << (bit % 64)
                        };
                        "global_status bit the hypervisor did not set"
                    }
                }
            }
        }
    }

    /// Whether a vendor area of arbitrary bytes is certainly refused: its global control word
    /// enables a counter that does not exist (a check every verification makes).
    pub fn certainly_invalid(&self, area: &VendorArea) -> bool {
        let global = area.words[2];
        match *self {
            Driver::Intel { gp, fixed, .. } => {
                global & !(((1u64 << gp) - 1) | u64::from(fixed) << 32) != 0
            }
            Driver::Amd {
                counters, v2: true, ..
            } => global >> counters != 0,
            Driver::Amd { .. } => global != 0,
        }
    }
}
