//! The context in the shared page's vendor area (`IntelCtxt` plus banks), always addressed
//! through the layout this backend computed: the geometry words in the page are written for the
//! guest and never read back.

use core::mem::offset_of;

use vpmu::abi::{
    AbiError, IntelBanks, IntelCtxt, VendorArea, XENPMU_REFUSED_ABSENT, XENPMU_REFUSED_RESERVED,
    XENPMU_REFUSED_STATUS,
};
use vpmu::{ContextError, CounterSet, GuestPolicy, PublishedImages};

use crate::backend::IntelPmu;
use crate::context::{FIXED_SLOTS, GP_SLOTS, IntelContext};
use crate::msrs::{
    IA32_DS_AREA, IA32_FIXED_CTR_CTRL, IA32_FIXED_CTR0, IA32_PEBS_ENABLE, IA32_PERF_GLOBAL_CTRL,
    IA32_PERF_GLOBAL_OVF_CTRL, IA32_PERF_GLOBAL_STATUS, IA32_PERFEVTSEL0,
};
use crate::policy::Refused;
use crate::restrict::{self, Restricted};

/// The hardware image of a control the guest did not edit: restricted, never refused.
fn unedited(restricted: Restricted) -> u64 {
    restricted.unwrap_or_else(|image| image)
}

/// A register of the page as a refusal names it: its name, counter index (banked registers)
/// and the MSR a WRMSR of it would name.
#[derive(Clone, Copy)]
struct Named {
    register: &'static str,
    index: Option<u32>,
    msr: u32,
}

const fn named(register: &'static str, msr: u32) -> Named {
    Named {
        register,
        index: None,
        msr,
    }
}

const fn banked(register: &'static str, base: u32, index: u32) -> Named {
    Named {
        register,
        index: Some(index),
        msr: base + index,
    }
}

fn refused(at: Named, value: u64, reason: u32) -> ContextError {
    ContextError {
        register: at.register,
        index: at.index,
        value,
        msr: at.msr,
        reason,
    }
}

/// Turns a validator's refusal into the flush error naming the register and the reason.
trait OrRefuse<T> {
    fn or_refuse(self, at: Named, value: u64) -> Result<T, ContextError>;
}

impl<T> OrRefuse<T> for Result<T, Refused> {
    fn or_refuse(self, at: Named, value: u64) -> Result<T, ContextError> {
        self.map_err(|Refused(reason)| refused(at, value, reason))
    }
}

/// The first refused fixed counter, `index`, as the flush reports it: a value above the width
/// (the WRMSR validator's reason) or a hole of a sparse bank that is not 0. Out of line: only a
/// refused page gets here.
#[cold]
#[inline(never)]
fn fixed_refused(
    rules: &crate::GuestRules,
    values: &[u64; FIXED_SLOTS],
    holes: u32,
    index: u32,
) -> ContextError {
    let value = values.get(index as usize).map_or(0, |&value| value);
    let reason = if holes & 1 << index != 0 {
        XENPMU_REFUSED_ABSENT
    } else {
        rules
            .fixed_counter(value)
            .err()
            .map_or(XENPMU_REFUSED_RESERVED, |Refused(r)| r)
    };
    refused(
        banked("fixed_counter", IA32_FIXED_CTR0, index),
        value,
        reason,
    )
}

/// The registers of `IntelCtxt` (not its geometry words, which are never read back), each
/// read from its own word of the area: no copy of the whole fixed part.
struct Registers {
    global_ctrl: u64,
    global_status: u64,
    global_ovf_ctrl: u64,
    fixed_ctrl: u64,
    ds_area: u64,
    pebs_enable: u64,
}

impl Registers {
    #[inline]
    fn of(area: &VendorArea) -> Self {
        // Every field lies in the fixed part, well inside the area (`IntelCtxt` is 8-byte
        // aligned `repr(C)`, checked by the ABI's layout assertions).
        let at = |offset: usize| area.words.get(offset / size_of::<u64>()).map_or(0, |&w| w);
        Registers {
            global_ctrl: at(offset_of!(IntelCtxt, global_ctrl)),
            global_status: at(offset_of!(IntelCtxt, global_status)),
            global_ovf_ctrl: at(offset_of!(IntelCtxt, global_ovf_ctrl)),
            fixed_ctrl: at(offset_of!(IntelCtxt, fixed_ctrl)),
            ds_area: at(offset_of!(IntelCtxt, ds_area)),
            pebs_enable: at(offset_of!(IntelCtxt, pebs_enable)),
        }
    }
}

/// Where the backend's layout puts the banks in the vendor area, as windows of whole slots
/// (`FIXED_SLOTS` words, `GP_SLOTS` pairs), computed once from [`IntelBanks`]: a flush then
/// reads every bank in one straight pass. The words of a window past its bank belong to whatever
/// follows it (the next bank, or nothing): they are masked to 0 (`*_keep`), never judged and
/// never loaded. Only the backend's layout is used: the geometry words in the page are the
/// guest's to scribble on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PageWindows {
    fixed_word: usize,
    gp_word: usize,
    /// The slots inside each bank, as bitmaps, and whether a window reaches past its bank.
    fixed_slots: u32,
    gp_slots: u32,
    partial: bool,
    /// The fixed counters present (a v5 bitmap may leave holes in the bank).
    fixed_present: u32,
}

impl PageWindows {
    /// The windows of `banks`, for a PMU whose fixed counters are `fixed_present`. Fails if a
    /// window would reach past the vendor area (it never does for the canonical layout: the
    /// fixed part, 4 fixed words and 8 pairs take 28 of its 128 words).
    pub(crate) fn new(banks: &IntelBanks, fixed_present: u32) -> Result<Self, AbiError> {
        let mut ctxt = IntelCtxt::default();
        banks.describe_in(&mut ctxt);
        let word = |bytes: u32| bytes as usize / size_of::<u64>();
        let (fixed_word, gp_word) = (word(ctxt.fixed_counters), word(ctxt.arch_counters));
        let area_words = VendorArea::default().words.len();
        let fits = |bank, start: usize, words: usize, count: u32| {
            if start + words <= area_words {
                Ok(())
            } else {
                Err(AbiError::BankOutOfBounds {
                    bank,
                    offset: start * size_of::<u64>(),
                    count: count as usize,
                })
            }
        };
        fits("intel fixed", fixed_word, FIXED_SLOTS, ctxt.fixed_count)?;
        fits("intel arch", gp_word, 2 * GP_SLOTS, ctxt.arch_count)?;
        let slots = |count: u32, limit: usize| ((1u64 << count.min(limit as u32)) - 1) as u32;
        let (fixed_slots, gp_slots) = (
            slots(ctxt.fixed_count, FIXED_SLOTS),
            slots(ctxt.arch_count, GP_SLOTS),
        );
        Ok(PageWindows {
            fixed_word,
            gp_word,
            fixed_slots,
            gp_slots,
            partial: fixed_slots != (1 << FIXED_SLOTS) - 1 || gp_slots != (1 << GP_SLOTS) - 1,
            fixed_present,
        })
    }

    /// Zeroes the slots read past the banks (a PMU with fewer counters than slots).
    #[cold]
    fn trim(
        &self,
        fixed: &mut [u64; FIXED_SLOTS],
        counters: &mut [u64; GP_SLOTS],
        controls: &mut [u64; GP_SLOTS],
    ) {
        for (i, value) in fixed.iter_mut().enumerate() {
            if self.fixed_slots & 1 << i == 0 {
                *value = 0;
            }
        }
        for (i, (counter, control)) in counters.iter_mut().zip(controls).enumerate() {
            if self.gp_slots & 1 << i == 0 {
                (*counter, *control) = (0, 0);
            }
        }
    }

    fn fixed<'a>(&self, area: &'a VendorArea) -> Option<&'a [u64; FIXED_SLOTS]> {
        area.words.get(self.fixed_word..)?.first_chunk()
    }

    /// Counter `i` at word `2i`, its control at `2i + 1` (`CounterPair`).
    fn gp<'a>(&self, area: &'a VendorArea) -> Option<&'a [u64; 2 * GP_SLOTS]> {
        area.words.get(self.gp_word..)?.first_chunk()
    }
}

/// The live slots of `live` after their counters were taken by the page rule: those whose
/// counter or control is non-zero.
#[cold]
fn retake_live(counters: &[u64; GP_SLOTS], controls: &[u64; GP_SLOTS], live: u32) -> u32 {
    (0..GP_SLOTS).fold(0, |bits, i| {
        if live & 1 << i != 0 && counters[i] | controls[i] != 0 {
            bits | 1 << i
        } else {
            bits
        }
    })
}

impl IntelPmu {
    #[inline]
    pub(crate) fn write_page(&self, ctx: &IntelContext, area: &mut VendorArea) {
        let mut ctxt = IntelCtxt {
            global_ctrl: ctx.global_ctrl,
            global_status: ctx.global_status,
            global_ovf_ctrl: 0,
            fixed_ctrl: ctx.fixed_ctrl,
            ds_area: ctx.ds_area,
            pebs_enable: 0,
            ..IntelCtxt::default()
        };
        self.page_banks.describe_in(&mut ctxt);
        area.set_intel_ctxt(&ctxt);
        self.page_banks.set_banks(
            area,
            &ctx.fixed_counters,
            &ctx.gp_counters,
            &ctx.event_selects,
        );
    }

    /// Rebuilds every register from the (already copied) area and verifies it with the WRMSR
    /// validators. The first violation is returned and `out` is left as it was: every check
    /// runs before the first write to it. Nothing is repaired. A control (each PERFEVTSELx,
    /// FIXED_CTR_CTRL, DS_AREA) left exactly as `saved` publishes it was legal when published:
    /// it is not refused but given the hardware image [`restrict`] computes under `policy`, so
    /// an unedited page always flushes whatever the policy became since; with `images`
    /// [`PublishedImages::Current`] that image is the one `saved` holds (DS_AREA is its own
    /// image), taken as it is.
    ///
    /// The banks are read as whole-slot windows ([`PageWindows`]) in one straight pass; the
    /// counters are judged a bank at a time ([`GuestRules::fixed_counters_within`]; the GP
    /// counters are taken as their WRMSR takes them, [`GuestRules::page_counters`], and never
    /// refused), and only the non-zero controls go through their validator one by one.
    /// Violations are still reported in the page's order: the fixed part, then each fixed
    /// counter, then each control. A refusal names the register, the MSR a WRMSR of it would
    /// name, and the validator's reason.
    pub(crate) fn read_page_into(
        &self,
        area: &VendorArea,
        saved: &IntelContext,
        images: PublishedImages,
        policy: &GuestPolicy<'_>,
        out: &mut IntelContext,
    ) -> Result<(), ContextError> {
        let rules = &self.rules;
        let current = images == PublishedImages::Current;
        let ctxt = Registers::of(area);

        let global_ctrl = rules.global_ctrl(ctxt.global_ctrl).or_refuse(
            named("global_ctrl", IA32_PERF_GLOBAL_CTRL),
            ctxt.global_ctrl,
        )?;
        let fixed_ctrl_hw = if ctxt.fixed_ctrl == saved.fixed_ctrl {
            if current {
                saved.fixed_ctrl_hw
            } else {
                unedited(restrict::fixed_ctrl(rules, ctxt.fixed_ctrl, policy))
            }
        } else {
            rules
                .fixed_ctrl(ctxt.fixed_ctrl, policy)
                .or_refuse(named("fixed_ctrl", IA32_FIXED_CTR_CTRL), ctxt.fixed_ctrl)?
        };
        // Acknowledging is clearing: the owner may drop recorded overflows, never invent one.
        if ctxt.global_status & !saved.global_status != 0 {
            return Err(refused(
                named("global_status", IA32_PERF_GLOBAL_STATUS),
                ctxt.global_status,
                XENPMU_REFUSED_STATUS,
            ));
        }
        let acknowledged = rules.ovf_ctrl(ctxt.global_ovf_ctrl).or_refuse(
            named("global_ovf_ctrl", IA32_PERF_GLOBAL_OVF_CTRL),
            ctxt.global_ovf_ctrl,
        )?;
        let ds_area = if ctxt.ds_area == saved.ds_area {
            if current {
                saved.ds_area
            } else {
                unedited(restrict::ds_area(rules, ctxt.ds_area, policy))
            }
        } else {
            rules
                .ds_area(ctxt.ds_area, policy)
                .or_refuse(named("ds_area", IA32_DS_AREA), ctxt.ds_area)?
        };
        rules
            .pebs_enable(ctxt.pebs_enable)
            .or_refuse(named("pebs_enable", IA32_PEBS_ENABLE), ctxt.pebs_enable)?;

        let windows = &self.page_windows;
        // Never taken: the windows were checked against the area when they were made.
        let Some(fixed) = windows.fixed(area) else {
            return Err(refused(
                banked("fixed_counter", IA32_FIXED_CTR0, 0),
                0,
                XENPMU_REFUSED_RESERVED,
            ));
        };
        let Some(gp) = windows.gp(area) else {
            return Err(refused(
                banked("evtsel", IA32_PERFEVTSEL0, 0),
                0,
                XENPMU_REFUSED_RESERVED,
            ));
        };
        // One pass over every slot. Entries whose value and control are both 0 pass every
        // validator as 0: only the others ("live") can be refused or count, and most slots
        // are not live (a branch each, then nothing).
        let mut fixed_counters = *fixed;
        let mut fixed_union = fixed_counters.iter().fold(0, |union, &value| union | value);
        // A profiler that programs no fixed counter leaves the bank 0: nothing live in it.
        let mut fixed_live = 0u32;
        if fixed_union != 0 {
            for (i, &value) in fixed_counters.iter().enumerate() {
                if value != 0 {
                    fixed_live |= 1 << i;
                }
            }
        }
        let mut gp_counters = [0u64; GP_SLOTS];
        let mut event_selects = [0u64; GP_SLOTS];
        let mut gp_union = 0u64;
        let mut gp_live = 0u32;
        for i in 0..GP_SLOTS {
            let (counter, control) = (gp[2 * i], gp[2 * i + 1]);
            gp_counters[i] = counter;
            event_selects[i] = control;
            gp_union |= counter;
            if counter | control != 0 {
                gp_live |= 1 << i;
            }
        }
        if windows.partial {
            // The words of a window past its bank are not the bank's: 0, as the context holds
            // the slots past the banks.
            windows.trim(&mut fixed_counters, &mut gp_counters, &mut event_selects);
            fixed_live &= windows.fixed_slots;
            gp_live &= windows.gp_slots;
            fixed_union = fixed_counters.iter().fold(0, |union, &value| union | value);
            gp_union = gp_counters.iter().fold(0, |union, &value| union | value);
        }
        // A sparse v5 bitmap leaves holes in the bank; they must stay 0.
        let holes = fixed_live & !windows.fixed_present;
        if let Err(index) = rules.fixed_counters_within(&fixed_counters, fixed_union, holes) {
            return Err(fixed_refused(rules, &fixed_counters, holes, index));
        }
        // GP counters are taken as their WRMSR takes them, never refused; a value that was not
        // taken whole may have become 0, and a slot with both words 0 is not live.
        if rules.page_counters(&mut gp_counters, gp_union) {
            gp_live = retake_live(&gp_counters, &event_selects, gp_live);
        }
        let mut event_selects_hw = [0u64; GP_SLOTS];
        let mut judged = gp_live;
        while judged != 0 {
            let index = judged.trailing_zeros();
            judged &= judged - 1;
            let i = index as usize;
            let (Some(&control), Some(&published), Some(&published_hw), Some(image)) = (
                event_selects.get(i),
                saved.event_selects.get(i),
                saved.event_selects_hw.get(i),
                event_selects_hw.get_mut(i),
            ) else {
                continue;
            };
            *image = if control == published {
                if current {
                    published_hw
                } else {
                    unedited(restrict::event_select(rules, control, policy))
                }
            } else {
                rules
                    .event_select(control, policy)
                    .or_refuse(banked("evtsel", IA32_PERFEVTSEL0, index), control)?
            };
        }

        // Verified: from here on nothing fails.
        out.fixed_counters = fixed_counters;
        out.gp_counters = gp_counters;
        out.event_selects = event_selects;
        out.event_selects_hw = event_selects_hw;
        out.fixed_ctrl = ctxt.fixed_ctrl;
        out.fixed_ctrl_hw = fixed_ctrl_hw;
        out.global_ctrl = global_ctrl;
        out.global_status = ctxt.global_status & !acknowledged;
        out.ds_area = ds_area;
        // In use: a non-zero value or control (`IntelContext::recompute_in_use`).
        // No fixed counter programmed is the common case: no nibble to gather.
        let fixed_ctrl_live = if ctxt.fixed_ctrl == 0 {
            0
        } else {
            restrict::nibble_mask(ctxt.fixed_ctrl) & ((1 << FIXED_SLOTS) - 1)
        };
        out.in_use = CounterSet(
            u64::from(gp_live) | u64::from(fixed_live | fixed_ctrl_live) << CounterSet::FIXED_BASE,
        );
        #[cfg(debug_assertions)]
        {
            let mut check = out.clone();
            check.recompute_in_use();
            debug_assert_eq!(check.in_use, out.in_use, "in_use of a flushed page");
        }
        Ok(())
    }
}
