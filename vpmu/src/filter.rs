//! A per-domain allow/deny list of events, with the semantics of KVM's PMU event filter
//! (`KVM_SET_PMU_EVENT_FILTER`, masked-entry form), in fixed capacity so it needs no heap.
//!
//! An event is *filtered* when some include entry matches it and no exclude entry does; an
//! entry matches when its event select is equal and `(umask & umask_mask) == umask_match`.
//! With an allow list only filtered events count; with a deny list filtered events do not.
//! Fixed counters are decided by a bitmap alone: allow lists let through the counters whose bit
//! is set, deny lists block them. A blocked event is not a fault: the guest reads back what it
//! programmed and the counter does not count.

use crate::backend::{EventFilter, RawEvent};

/// Whether a list names what may count or what may not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FilterAction {
    /// Only the listed events count.
    Allow,
    /// The listed events do not count.
    Deny,
}

/// One entry of an event list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventMatch {
    /// Event select (12 bits on AMD, 8 on Intel).
    pub select: u16,
    /// Unit-mask bits that take part in the match.
    pub umask_mask: u8,
    /// Required value of those bits.
    pub umask_match: u8,
    /// An exclude entry carves events out of what the include entries match.
    pub exclude: bool,
}

impl EventMatch {
    /// Every unit mask of event `select`.
    pub const fn event(select: u16) -> Self {
        Self {
            select,
            umask_mask: 0,
            umask_match: 0,
            exclude: false,
        }
    }

    /// Event `select` with exactly unit mask `umask`.
    pub const fn event_umask(select: u16, umask: u8) -> Self {
        Self {
            select,
            umask_mask: 0xff,
            umask_match: umask,
            exclude: false,
        }
    }

    /// Event `select` where `umask & mask == value` (KVM's masked entry).
    pub const fn masked(select: u16, mask: u8, value: u8, exclude: bool) -> Self {
        Self {
            select,
            umask_mask: mask,
            umask_match: value,
            exclude,
        }
    }

    fn matches(&self, event: RawEvent) -> bool {
        self.select == event.select && event.umask & self.umask_mask == self.umask_match
    }
}

/// The list is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListFull;

/// An allow or deny list of at most `N` entries, plus the fixed-counter bitmap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventList<const N: usize> {
    action: FilterAction,
    entries: [EventMatch; N],
    len: usize,
    fixed_counters: u32,
}

impl<const N: usize> EventList<N> {
    /// An empty list: an empty allow list lets nothing count, an empty deny list everything.
    /// `fixed_counters` is the bitmap of fixed counters the action applies to.
    pub const fn new(action: FilterAction, fixed_counters: u32) -> Self {
        Self {
            action,
            entries: [EventMatch::event(0); N],
            len: 0,
            fixed_counters,
        }
    }

    /// A list of `entries`; fails if there are more than `N`.
    pub fn from_entries(
        action: FilterAction,
        fixed_counters: u32,
        entries: &[EventMatch],
    ) -> Result<Self, ListFull> {
        let mut list = Self::new(action, fixed_counters);
        for entry in entries {
            list.push(*entry)?;
        }
        Ok(list)
    }

    /// Adds an entry.
    pub fn push(&mut self, entry: EventMatch) -> Result<(), ListFull> {
        let slot = self.entries.get_mut(self.len).ok_or(ListFull)?;
        *slot = entry;
        self.len += 1;
        Ok(())
    }

    /// The entries.
    pub fn entries(&self) -> &[EventMatch] {
        self.entries.get(..self.len).unwrap_or(&[])
    }

    /// The action.
    pub fn action(&self) -> FilterAction {
        self.action
    }

    fn is_listed(&self, event: RawEvent) -> bool {
        let entries = self.entries();
        let included = entries.iter().any(|e| !e.exclude && e.matches(event));
        let excluded = entries.iter().any(|e| e.exclude && e.matches(event));
        included && !excluded
    }
}

impl<const N: usize> EventFilter for EventList<N> {
    fn allows(&self, event: RawEvent) -> bool {
        match self.action {
            FilterAction::Allow => self.is_listed(event),
            FilterAction::Deny => !self.is_listed(event),
        }
    }

    fn allows_fixed(&self, index: u32) -> bool {
        let listed = index < 32 && self.fixed_counters & (1 << index) != 0;
        match self.action {
            FilterAction::Allow => listed,
            FilterAction::Deny => !listed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INSTRUCTIONS: RawEvent = RawEvent {
        select: 0xc0,
        umask: 0,
    };
    const BRANCHES_INTEL: RawEvent = RawEvent {
        select: 0xc4,
        umask: 0,
    };
    const BRANCHES_AMD: RawEvent = RawEvent {
        select: 0xc2,
        umask: 0,
    };
    /// The base list of KVM's pmu_event_filter_test: the 8 Intel architectural events and AMD's
    /// retired branches.
    const BASE: [EventMatch; 9] = [
        EventMatch::event_umask(0x3c, 0),
        EventMatch::event_umask(0xc0, 0),
        EventMatch::event_umask(0x3c, 1),
        EventMatch::event_umask(0x2e, 0x4f),
        EventMatch::event_umask(0x2e, 0x41),
        EventMatch::event_umask(0xc4, 0),
        EventMatch::event_umask(0xc5, 0),
        EventMatch::event_umask(0xa4, 1),
        EventMatch::event_umask(0xc2, 0),
    ];

    fn counting(filter: &impl EventFilter) -> bool {
        [INSTRUCTIONS, BRANCHES_INTEL, BRANCHES_AMD]
            .iter()
            .all(|e| filter.allows(*e))
    }

    fn not_counting(filter: &impl EventFilter) -> bool {
        [INSTRUCTIONS, BRANCHES_INTEL, BRANCHES_AMD]
            .iter()
            .all(|e| !filter.allows(*e))
    }

    #[test]
    fn kvm_selftest_allow_and_deny_table() {
        let deny = EventList::<16>::from_entries(FilterAction::Deny, 0, &BASE).unwrap();
        assert!(not_counting(&deny));
        let allow = EventList::<16>::from_entries(FilterAction::Allow, 0, &BASE).unwrap();
        assert!(counting(&allow));
        let without: [EventMatch; 6] = [BASE[0], BASE[2], BASE[3], BASE[4], BASE[6], BASE[7]];
        let deny_rest = EventList::<16>::from_entries(FilterAction::Deny, 0, &without).unwrap();
        assert!(counting(&deny_rest));
        let allow_rest = EventList::<16>::from_entries(FilterAction::Allow, 0, &without).unwrap();
        assert!(not_counting(&allow_rest));
    }

    #[test]
    fn amd_twelve_bit_select_is_a_different_event() {
        let deny = EventList::<1>::from_entries(FilterAction::Deny, 0, &[EventMatch::event(0x1c2)])
            .unwrap();
        assert!(deny.allows(BRANCHES_AMD));
        assert!(!deny.allows(RawEvent {
            select: 0x1c2,
            umask: 0
        }));
    }

    #[test]
    fn masked_entries_select_unit_masks() {
        let loads = RawEvent {
            select: 0xd0,
            umask: 0x81,
        };
        let stores = RawEvent {
            select: 0xd0,
            umask: 0x82,
        };
        let both = RawEvent {
            select: 0xd0,
            umask: 0x83,
        };
        let allowed = |entries: &[EventMatch]| {
            let list = EventList::<4>::from_entries(FilterAction::Allow, 0, entries).unwrap();
            [list.allows(loads), list.allows(stores), list.allows(both)]
        };
        assert_eq!(
            allowed(&[EventMatch::masked(0xd0, 0xff, 0x81, false)]),
            [true, false, false]
        );
        assert_eq!(
            allowed(&[
                EventMatch::masked(0xd0, 0x7c, 0, false),
                EventMatch::masked(0xd0, 0xff, 0x83, true)
            ]),
            [true, true, false]
        );
        assert_eq!(
            allowed(&[EventMatch::masked(0xd0, 0xfe, 0x82, false)]),
            [false, true, true]
        );
        assert_eq!(
            allowed(&[EventMatch::masked(0xd0, 0x7c, 0, false)]),
            [true, true, true]
        );
    }

    #[test]
    fn fixed_counters_follow_the_bitmap_alone() {
        let allow = EventList::<2>::from_entries(FilterAction::Allow, 0b101, &BASE[..2]).unwrap();
        assert_eq!(
            [0, 1, 2, 3, 40].map(|i| allow.allows_fixed(i)),
            [true, false, true, false, false]
        );
        let deny = EventList::<2>::from_entries(FilterAction::Deny, 0b101, &BASE[..2]).unwrap();
        assert_eq!(
            [0, 1, 2, 3, 40].map(|i| deny.allows_fixed(i)),
            [false, true, false, true, true]
        );
    }

    #[test]
    fn capacity_is_enforced() {
        let mut list = EventList::<1>::new(FilterAction::Deny, 0);
        assert_eq!(list.push(BASE[0]), Ok(()));
        assert_eq!(list.push(BASE[1]), Err(ListFull));
        assert_eq!(list.entries(), &BASE[..1]);
        assert!(EventList::<2>::from_entries(FilterAction::Deny, 0, &BASE).is_err());
    }
}
