//! The test shapes: one definition of each PMU the simulator, the reference VMM and the fuzz
//! targets are built of, and of how its enumeration, backend and model are made.
//!
//! [`Shape`] names the four shapes (`intel-v5`, `intel-v2`, `amd-perfmonv2`, `amd-k7`).
//! [`IntelShape`] and [`AmdShape`] are their set-ups: what the backend enumerates and the model
//! is built from, with `caps()`, and, through [`VendorShape`], `backend()` and `model()`. A user with an exotic PMU (the fuzz
//! targets) builds an [`IntelShape`] or [`AmdShape`] of it directly and uses the same methods.
//!
//! What legitimately differs between users is an argument: the Intel shapes take the
//! architectural events the event source cannot count (CPUID.0AH:EBX, bit set = unavailable;
//! [`ALL_EVENTS`] for none), which both the guest and the model are told, and which decides the
//! fixed counters present (a fixed counter exists when its event is available).
//!
//! ```
//! use vpmu_models::shapes::{ALL_EVENTS, Shape};
//!
//! let shape: Shape = "intel-v5".parse().unwrap();
//! let intel = shape.intel(ALL_EVENTS).unwrap();
//! assert_eq!(intel.caps().gp_counters(), 8);
//! assert_eq!(intel.to_string(), "intel v5 8GP+4F FW");
//! assert_eq!(Shape::AmdK7.amd().unwrap().caps().gp_counters(), 4);
//! ```

use core::fmt;
use core::str::FromStr;

use vpmu::{PmuBackend, Vendor};
use vpmu_amd::{AmdCaps, AmdPmu, PmuShape};
use vpmu_intel::{IntelCaps, IntelPmu, PERF_CAP_FW_WRITES};

use crate::SoftwarePmu;
use crate::amd::AmdPmuModel;
use crate::intel::{IntelPmuModel, SyntheticCpuid};

/// A vendor's PMU shape ([`IntelShape`], [`AmdShape`]): what a user needs to build a machine
/// of it, whatever the vendor. Its `Display` is a label for reports.
pub trait VendorShape: Copy + fmt::Debug + fmt::Display {
    /// The core's backend.
    type Backend: PmuBackend + fmt::Debug;
    /// The software PMU model.
    type Model: SoftwarePmu + Clone + fmt::Debug;

    /// A fresh backend.
    ///
    /// # Panics
    /// If the backend refuses the shape (every shape of this module is supported).
    fn backend(&self) -> Self::Backend;

    /// A fresh model in its power-on (reset) state.
    ///
    /// # Panics
    /// As [`VendorShape::backend`].
    fn model(&self) -> Self::Model;
}

/// The four test shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// Intel architectural PMU v5: 8 GP counters, fixed counters of the available events,
    /// full-width counter writes ([`IntelShape::v5`]).
    IntelV5,
    /// Intel architectural PMU v2: 4 GP counters, up to 3 fixed counters, legacy counter writes
    /// only ([`IntelShape::v2`]).
    IntelV2,
    /// AMD PerfMonV2 with 6 core counters ([`AmdShape::perfmon_v2`]).
    AmdPerfMonV2,
    /// AMD legacy K7: 4 counters, no global registers ([`AmdShape::k7`]).
    AmdK7,
}

/// No architectural event is unavailable: the argument of the Intel shapes for an event source
/// that counts every event (the simulator's).
pub const ALL_EVENTS: u32 = 0;

impl Shape {
    /// Every shape, Intel first.
    pub const ALL: [Shape; 4] = [
        Shape::IntelV5,
        Shape::IntelV2,
        Shape::AmdPerfMonV2,
        Shape::AmdK7,
    ];

    /// The shape's name: `intel-v5`, `intel-v2`, `amd-perfmonv2` or `amd-k7`.
    pub const fn name(self) -> &'static str {
        match self {
            Shape::IntelV5 => "intel-v5",
            Shape::IntelV2 => "intel-v2",
            Shape::AmdPerfMonV2 => "amd-perfmonv2",
            Shape::AmdK7 => "amd-k7",
        }
    }

    /// The vendor whose PMU this is.
    pub const fn vendor(self) -> Vendor {
        match self {
            Shape::IntelV5 | Shape::IntelV2 => Vendor::Intel,
            Shape::AmdPerfMonV2 | Shape::AmdK7 => Vendor::Amd,
        }
    }

    /// The set-up of an Intel shape whose event source cannot count the architectural events
    /// `unavailable_events` (CPUID.0AH:EBX bits; [`ALL_EVENTS`] for none); `None` for an AMD
    /// shape.
    pub const fn intel(self, unavailable_events: u32) -> Option<IntelShape> {
        match self {
            Shape::IntelV5 => Some(IntelShape::v5(unavailable_events)),
            Shape::IntelV2 => Some(IntelShape::v2(unavailable_events)),
            Shape::AmdPerfMonV2 | Shape::AmdK7 => None,
        }
    }

    /// The set-up of an AMD shape; `None` for an Intel shape.
    pub const fn amd(self) -> Option<AmdShape> {
        match self {
            Shape::AmdPerfMonV2 => Some(AmdShape::perfmon_v2()),
            Shape::AmdK7 => Some(AmdShape::k7()),
            Shape::IntelV5 | Shape::IntelV2 => None,
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`Shape::ALL`]'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownShape;

impl fmt::Display for UnknownShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unknown PMU shape (expected intel-v5, intel-v2, amd-perfmonv2 or amd-k7)")
    }
}

impl FromStr for Shape {
    type Err = UnknownShape;

    fn from_str(name: &str) -> Result<Self, UnknownShape> {
        Shape::ALL
            .into_iter()
            .find(|shape| shape.name() == name)
            .ok_or(UnknownShape)
    }
}

/// The architectural event (its CPUID.0AH:EBX bit) fixed counter `i` counts: instructions,
/// core cycles, reference cycles, topdown slots.
const FIXED_COUNTER_EVENT_BITS: [u32; 4] = [1, 0, 2, 7];

/// The fixed counters (bitmap) whose events `unavailable_events` leaves available.
const fn fixed_counters_counting(unavailable_events: u32) -> u32 {
    let mut present = 0;
    let mut index = 0;
    while index < FIXED_COUNTER_EVENT_BITS.len() {
        if unavailable_events & (1 << FIXED_COUNTER_EVENT_BITS[index]) == 0 {
            present |= 1 << index;
        }
        index += 1;
    }
    present
}

/// An Intel PMU: the synthetic CPUID the backend enumerates, the model is built from and a
/// guest is shown, and IA32_PERF_CAPABILITIES.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntelShape {
    /// The CPUID.
    pub cpuid: SyntheticCpuid,
    /// IA32_PERF_CAPABILITIES (`None`: not readable).
    pub perf_capabilities: Option<u64>,
}

impl IntelShape {
    /// Version 5 ([`Shape::IntelV5`]): 8 GP counters, full-width writes (FW_WRITE), the
    /// architectural events `unavailable_events` advertised unavailable, and the fixed counters
    /// of the other events: the contiguous ones from 0 in the count, the rest in the bitmap
    /// (with [`ALL_EVENTS`]: fixed counters 0–3).
    pub const fn v5(unavailable_events: u32) -> Self {
        let fixed = fixed_counters_counting(unavailable_events);
        let contiguous = fixed.trailing_ones();
        let mut cpuid = SyntheticCpuid::v5(8, contiguous as u8, fixed & !((1 << contiguous) - 1));
        cpuid.unavailable_events = unavailable_events;
        IntelShape {
            cpuid,
            perf_capabilities: Some(PERF_CAP_FW_WRITES),
        }
    }

    /// Version 2 ([`Shape::IntelV2`]): 4 GP counters, legacy counter writes only, the
    /// architectural events `unavailable_events` advertised unavailable, and contiguous fixed
    /// counters up to the highest one whose event is available (v2 has no bitmap; at most 3,
    /// so 3 with [`ALL_EVENTS`]); those below it whose event is unavailable never count.
    pub const fn v2(unavailable_events: u32) -> Self {
        let fixed = fixed_counters_counting(unavailable_events);
        let highest = u32::BITS - fixed.leading_zeros();
        let contiguous = if highest < 3 { highest } else { 3 };
        let mut cpuid = SyntheticCpuid::v2(4, contiguous as u8);
        cpuid.unavailable_events = unavailable_events;
        IntelShape {
            cpuid,
            perf_capabilities: None,
        }
    }

    /// The enumeration of this PMU.
    ///
    /// # Panics
    /// If the backend refuses the shape (every shape of this module is supported).
    pub fn caps(&self) -> IntelCaps {
        IntelCaps::from_cpuid(self.cpuid, self.perf_capabilities).expect("a supported Intel shape")
    }
}

impl VendorShape for IntelShape {
    type Backend = IntelPmu;
    type Model = IntelPmuModel;

    fn backend(&self) -> IntelPmu {
        IntelPmu::new(self.caps()).expect("a supported Intel shape")
    }

    fn model(&self) -> IntelPmuModel {
        IntelPmuModel::new(self.caps())
    }
}

/// `intel v5 8GP+4F FW`: version, GP counters, fixed counters present, and `FW` when
/// IA32_PERF_CAPABILITIES is given.
impl fmt::Display for IntelShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fixed = IntelCaps::from_cpuid(self.cpuid, self.perf_capabilities)
            .map_or(0, |caps| caps.fixed_counters().count_ones());
        write!(
            f,
            "intel v{} {}GP+{}F{}",
            self.cpuid.version,
            self.cpuid.gp_counters,
            fixed,
            if self.perf_capabilities.is_some() {
                " FW"
            } else {
                ""
            }
        )
    }
}

/// An AMD core PMU of an enumerated shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmdShape {
    /// The shape the backend enumerates and a guest's CPUID describes.
    pub pmu: PmuShape,
}

impl AmdShape {
    /// PerfMonV2 with 6 core counters ([`Shape::AmdPerfMonV2`]).
    pub const fn perfmon_v2() -> Self {
        AmdShape {
            pmu: PmuShape::PerfMonV2 { counters: 6 },
        }
    }

    /// Legacy K7: 4 counters, no global registers ([`Shape::AmdK7`]).
    pub const fn k7() -> Self {
        AmdShape {
            pmu: PmuShape::LegacyK7,
        }
    }

    /// The enumeration of this PMU.
    ///
    /// # Panics
    /// If the shape is invalid (every shape of this module is valid).
    pub fn caps(&self) -> AmdCaps {
        AmdCaps::from_shape(self.pmu).expect("a valid AMD shape")
    }
}

impl VendorShape for AmdShape {
    type Backend = AmdPmu;
    type Model = AmdPmuModel;

    fn backend(&self) -> AmdPmu {
        AmdPmu::new(self.caps()).expect("a supported AMD shape")
    }

    fn model(&self) -> AmdPmuModel {
        AmdPmuModel::new(self.caps())
    }
}

/// `amd perfmon-v2 6`, `amd ext-core 6`, `amd k7 4`.
impl fmt::Display for AmdShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pmu {
            PmuShape::LegacyK7 => f.write_str("amd k7 4"),
            PmuShape::PerfCtrExtCore => f.write_str("amd ext-core 6"),
            PmuShape::PerfMonV2 { counters } => write!(f, "amd perfmon-v2 {counters}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for shape in Shape::ALL {
            assert_eq!(shape.name().parse(), Ok(shape));
            assert_eq!(
                shape.intel(ALL_EVENTS).is_some(),
                shape.vendor() == Vendor::Intel
            );
            assert_eq!(shape.amd().is_some(), shape.vendor() == Vendor::Amd);
        }
        assert_eq!("intel".parse::<Shape>(), Err(UnknownShape));
    }

    #[test]
    fn intel_fixed_counters_follow_the_available_events() {
        // Every event: fixed counters 0–3 (v5), 0–2 (v2).
        assert_eq!(
            IntelShape::v5(ALL_EVENTS).cpuid,
            SyntheticCpuid::v5(8, 4, 0)
        );
        assert_eq!(IntelShape::v2(ALL_EVENTS).cpuid, SyntheticCpuid::v2(4, 3));
        // Instructions and branches only: fixed counter 0.
        let precise = 0b1101_1101;
        let v5 = IntelShape::v5(precise).cpuid;
        assert_eq!((v5.fixed_counters, v5.fixed_bitmap), (1, 0));
        assert_eq!(IntelShape::v2(precise).cpuid.fixed_counters, 1);
        // Core and reference cycles only: fixed counters 1 and 2 (v5 through the bitmap, v2
        // with fixed counter 0 present but never counting).
        let timed = 0b1111_1010;
        let v5 = IntelShape::v5(timed).cpuid;
        assert_eq!((v5.fixed_counters, v5.fixed_bitmap), (0, 0b110));
        assert_eq!(IntelShape::v2(timed).cpuid.fixed_counters, 3);
        assert_eq!(IntelShape::v2(timed).cpuid.unavailable_events, timed);
    }
}
