//! The architectural events: their `umask:event` encodings, their CPUID.0AH:EBX availability
//! bits, and the whitelists of the `XENPMU_FEATURE_IPC_ONLY` / `_ARCH_ONLY` restrictions.

/// The `umask:event` part of an event select (bits 15:0), the part the architectural encodings
/// and Xen's whitelists are stated in.
pub const fn umask_event(event_select: u64) -> u16 {
    (event_select & 0xffff) as u16
}

/// One architectural event (SDM vol. 3B, table "UMask and Event Select Encodings for
/// Pre-Defined Architectural Performance Events").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchEvent {
    /// `umask << 8 | event select`.
    pub encoding: u16,
    /// Bit of CPUID.0AH:EBX that, when set, says the event is not available.
    pub unavailable_bit: u32,
}

/// The seven architectural events CPUID.0AH:EBX enumerates through bit 6, in the order of
/// their bits: core cycles, instructions retired, reference cycles, LLC references, LLC misses,
/// branch instructions retired, branch mispredictions retired.
pub const ARCH_EVENTS: [ArchEvent; 7] = [
    ArchEvent {
        encoding: 0x003c,
        unavailable_bit: 0,
    },
    ArchEvent {
        encoding: 0x00c0,
        unavailable_bit: 1,
    },
    ArchEvent {
        encoding: 0x013c,
        unavailable_bit: 2,
    },
    ArchEvent {
        encoding: 0x4f2e,
        unavailable_bit: 3,
    },
    ArchEvent {
        encoding: 0x412e,
        unavailable_bit: 4,
    },
    ArchEvent {
        encoding: 0x00c4,
        unavailable_bit: 5,
    },
    ArchEvent {
        encoding: 0x00c5,
        unavailable_bit: 6,
    },
];

/// Events a guest may program under `XENPMU_FEATURE_IPC_ONLY` (Xen's table): unhalted core
/// cycles, unhalted reference cycles, instructions retired.
pub const IPC_ONLY_EVENTS: [u16; 3] = [0x003c, 0x013c, 0x00c0];

/// Events a guest may program under `XENPMU_FEATURE_ARCH_ONLY` (Xen's table): the IPC events
/// plus LLC references and misses, branches retired and branch mispredictions retired.
pub const ARCH_ONLY_EVENTS: [u16; 7] = [0x003c, 0x013c, 0x00c0, 0x4f2e, 0x412e, 0x00c4, 0x00c5];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_event_table_follows_the_sdm_bits() {
        for (bit, entry) in ARCH_EVENTS.iter().enumerate() {
            assert_eq!(entry.unavailable_bit as usize, bit);
        }
    }

    #[test]
    fn whitelists_are_architectural_encodings() {
        for encoding in ARCH_ONLY_EVENTS {
            assert!(ARCH_EVENTS.iter().any(|e| e.encoding == encoding));
        }
        for encoding in IPC_ONLY_EVENTS {
            assert!(ARCH_ONLY_EVENTS.contains(&encoding));
        }
    }

    #[test]
    fn umask_event_ignores_flag_bits() {
        assert_eq!(umask_event(0x0043_013c), 0x013c);
        assert_eq!(umask_event(0xffff_ffff_4f2e), 0x4f2e);
    }
}
