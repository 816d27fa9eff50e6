//! The bank loops against a recording bus.

use super::*;

/// Records every access; reads answer `value_of(msr)`.
#[derive(Default)]
struct Trace {
    accesses: [(bool, u32, u64); 32],
    len: usize,
}

impl Trace {
    fn log(&self) -> &[(bool, u32, u64)] {
        &self.accesses[..self.len]
    }
}

impl MsrBus for Trace {
    fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
        let value = u64::from(msr.0) << 32 | 0xffff_ffff;
        self.accesses[self.len] = (false, msr.0, value);
        self.len += 1;
        Ok(value)
    }

    fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
        self.accesses[self.len] = (true, msr.0, value);
        self.len += 1;
        Ok(())
    }
}

struct Ctx {
    gp: [u64; 4],
    gp_ctl: [u64; 4],
    fixed: [u64; 3],
    fixed_ctl: u64,
}

impl CounterBanks for Ctx {
    fn values(&self, bank: usize) -> &[u64] {
        if bank == 0 { &self.gp } else { &self.fixed }
    }
    fn saved_mut(&mut self, bank: usize) -> (&mut [u64], &[u64]) {
        if bank == 0 {
            (&mut self.gp, &self.gp_ctl)
        } else {
            (&mut self.fixed, core::slice::from_ref(&self.fixed_ctl))
        }
    }
    fn hardware_controls(&self, bank: usize) -> &[u64] {
        if bank == 0 {
            &self.gp_ctl
        } else {
            core::slice::from_ref(&self.fixed_ctl)
        }
    }
    fn interrupt_enabled(&self, bank: usize, index: u32) -> bool {
        bank == 0 && self.gp_ctl[index as usize] & 1 != 0
    }
}

const BANKS: [BankMap; 2] = [
    BankMap {
        first_bit: 0,
        counters: MsrSeries::new(0x201, 2),
        counter_writes: MsrSeries::new(0x201, 2),
        controls: Controls::PerCounter(MsrSeries::new(0x200, 2)),
        value_mask: 0xffff_ffff_ffff,
    },
    BankMap {
        first_bit: CounterSet::FIXED_BASE,
        counters: MsrSeries::new(0x309, 1),
        counter_writes: MsrSeries::new(0x309, 1),
        controls: Controls::Shared(Msr(0x38d)),
        value_mask: u64::MAX,
    },
];

fn ctx() -> Ctx {
    Ctx {
        gp: [1, 2, 3, 4],
        gp_ctl: [0x11, 0, 0x13, 0x14],
        fixed: [5, 6, 7],
        fixed_ctl: 0xb0,
    }
}

#[test]
fn indices_run_by_trailing_zeros() {
    let set = CounterSet(0b1010_0101 | 0b110 << 32);
    let mut gp = [0; 4];
    set.gp_indices().zip(&mut gp).for_each(|(i, s)| *s = i);
    assert_eq!(gp, [0, 2, 5, 7]);
    assert_eq!(BANKS[1].indices(set).len(), 2);
    assert_eq!(BANKS[1].set(0b110), CounterSet(0b110 << 32));
    assert_eq!(BANKS[1].counter(2), CounterSet::fixed(2));
}

#[test]
fn load_writes_what_the_record_does_not_know() {
    let mut hw = Trace::default();
    let set = CounterSet(0b0011 | 1 << 33);
    let present = CounterSet(0b1111 | 0b111 << 32);
    let mut record = HwRecord::unknown();
    record.controls_cleared();
    load(&BANKS, &ctx(), set, present, &mut hw, &mut record).unwrap();
    // Counter by counter, each value before its control; counter 1's control (image 0) is
    // known 0 already; the fixed bank's values, then its shared control.
    assert_eq!(
        hw.log(),
        [
            (true, 0x201, 1),
            (true, 0x200, 0x11),
            (true, 0x203, 2),
            (true, 0x30a, 6),
            (true, 0x38d, 0xb0)
        ]
    );
    // Saved and loaded again with nothing in between: the counters are read, nothing is
    // written.
    let mut c = ctx();
    let mut hw = Trace::default();
    save(
        &BANKS,
        &mut c,
        set,
        SaveControls::Keep,
        &mut hw,
        &mut record,
    )
    .unwrap();
    assert!(hw.log().iter().all(|&(write, ..)| !write));
    let mut hw = Trace::default();
    load(&BANKS, &c, set, present, &mut hw, &mut record).unwrap();
    assert_eq!(hw.log(), []);
    // Another context on counter 2 only: its value and control, then the stale controls
    // of counter 0 and of the fixed bank cleared.
    let mut other = ctx();
    other.gp_ctl = [0, 0, 0x13, 0];
    let mut hw = Trace::default();
    load(
        &BANKS,
        &other,
        CounterSet::gp(2),
        present,
        &mut hw,
        &mut record,
    )
    .unwrap();
    assert_eq!(
        hw.log(),
        [
            (true, 0x205, 3),
            (true, 0x204, 0x13),
            (true, 0x200, 0),
            (true, 0x38d, 0)
        ]
    );
}

#[test]
fn save_keeps_or_clears_controls() {
    let set = CounterSet(0b0101);
    let read = |msr: u32| u64::from(msr) << 32 | 0xffff_ffff;
    let mut first = ctx();
    let mut hw = Trace::default();
    let mut record = HwRecord::unknown();
    save(
        &BANKS,
        &mut first,
        set,
        SaveControls::Keep,
        &mut hw,
        &mut record,
    )
    .unwrap();
    let reads = [(false, 0x201, read(0x201)), (false, 0x205, read(0x205))];
    let clears = [(true, 0x200, 0), (true, 0x204, 0)];
    assert_eq!(hw.log(), reads);
    assert_eq!(first.gp[2], read(0x205) & 0xffff_ffff_ffff);
    assert!(record.knows_control(0, 0x11) && record.knows_value(2, first.gp[2]));
    let mut hw = Trace::default();
    save(
        &BANKS,
        &mut ctx(),
        set,
        SaveControls::Clear,
        &mut hw,
        &mut record,
    )
    .unwrap();
    assert_eq!(hw.log()[..2], clears);
    assert_eq!(hw.log()[2..], reads);
    assert!(record.knows_control(0, 0) && record.knows_control(2, 0));
}

#[test]
fn overflow_asks_the_context_for_interrupts() {
    let c = ctx();
    assert!(overflow(&BANKS, &c, CounterSet::gp(0)).interrupt);
    assert!(!overflow(&BANKS, &c, CounterSet::gp(1).union(CounterSet::fixed(0))).interrupt);
}

#[test]
fn fold_records_and_acknowledges_separately() {
    let status = StatusMsrs {
        status: Msr(0x38e),
        acknowledge: Msr(0x390),
    };
    let mut hw = Trace::default();
    let mut virtual_status = 0;
    let recorded = status
        .fold(&mut hw, 0b1, 0b11, &mut virtual_status)
        .unwrap();
    assert_eq!((recorded, virtual_status), (1, 1));
    assert_eq!(hw.log()[1], (true, 0x390, 0b11));
}

#[test]
fn load_writes_a_value_the_record_holds_but_does_not_know() {
    // The record's slots hold the context's value and control from an earlier time, but it
    // no longer knows them (another writer): a load must not take them for the hardware's.
    let c = ctx();
    let set = CounterSet(0b0001);
    let mut record = HwRecord::unknown();
    record.controls_cleared();
    record.set_value(0, Some(1));
    record.set_control(0, Some(0x11));
    let mut hw = Trace::default();
    load(&BANKS, &c, set, set, &mut hw, &mut record).unwrap();
    assert_eq!(hw.log(), [], "known and equal: nothing");
    record.set_value(0, Some(1));
    record.set_value(0, None);
    record.set_control(0, None);
    let mut hw = Trace::default();
    load(&BANKS, &c, set, set, &mut hw, &mut record).unwrap();
    assert_eq!(
        hw.log(),
        [(true, 0x201, 1), (true, 0x200, 0x11)],
        "a value and control no longer known are written again"
    );
    assert!(record.knows_control(0, 0x11) && !record.knows_value(0, 1));
}

#[test]
fn a_zero_control_recorded_at_a_save_is_not_written_again() {
    // Counter 1 is in use with control 0 (a value left after the guest cleared its control):
    // the save records the 0; a context that does not use counter 1 finds it 0 already.
    let mut c = ctx();
    let set = CounterSet(0b0011);
    let present = CounterSet(0b1111);
    let mut record = HwRecord::unknown();
    record.controls_cleared();
    load(&BANKS, &c, set, present, &mut Trace::default(), &mut record).unwrap();
    save(
        &BANKS,
        &mut c,
        set,
        SaveControls::Keep,
        &mut Trace::default(),
        &mut record,
    )
    .unwrap();
    assert!(record.knows_control(1, 0));
    let mut hw = Trace::default();
    load(&BANKS, &c, CounterSet::gp(0), present, &mut hw, &mut record).unwrap();
    assert!(
        hw.log().iter().all(|&(_, msr, _)| msr != 0x202),
        "counter 1's control rewritten: {:?}",
        hw.log()
    );
}
