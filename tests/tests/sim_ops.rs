//! The control operations' privilege / argument / version matrix.
//!
//! Every operation number (0–10, plus 11 and `u32::MAX`) × caller (privileged, unprivileged) ×
//! `version.major` (1, 0, 2) × `_pad0` (0, non-zero) × `vcpu` (0, 1, out of range, `u32::MAX`)
//! × the operation's interesting `val`s, in each of a set of machine states (vPMU unavailable;
//! mode off; self with nothing in use, with pages, with an unprivileged MSR user, with samples
//! cached; hv; all, with a sample cached; no room to map a page; self with a sample ring
//! (ABI 1.4), with a second vCPU's page inside a ring area, and on a platform without ring
//! support). The expected result comes
//! from an oracle written from docs/abi.md alone: its check order (operation, version,
//! privilege, arguments, state) and its per-operation error table. Every failing call must
//! leave the whole observable state unchanged (`Snapshot`); every successful one must have its
//! documented effect and OUT fields.

use std::collections::BTreeMap;

use vpmu::abi::ops::{CoverageParams, OpError, Params, XENPMU_COVERAGE_GET_SIZE};
use vpmu::abi::{
    PageView, RingConfig, XENPMU_FEATURE_ARCH_ONLY, XENPMU_FEATURE_INTEL_BTS,
    XENPMU_FEATURE_IPC_ONLY, XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_MASK, XENPMU_MODE_OFF,
    XENPMU_MODE_SELF, XENPMU_OP_COUNT, XENPMU_OP_COVERAGE, XENPMU_OP_FEATURE_GET,
    XENPMU_OP_FEATURE_SET, XENPMU_OP_FINISH, XENPMU_OP_FLUSH, XENPMU_OP_INIT, XENPMU_OP_LVTPC_SET,
    XENPMU_OP_MODE_GET, XENPMU_OP_MODE_SET, XENPMU_OP_RING_FINISH, XENPMU_OP_RING_INIT,
    XENPMU_RING_MAGIC, XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR,
};
use vpmu::{PmiOutcome, VcpuId, VcpuState, Vpmu};
use vpmu_sim::helpers::sampling;
use vpmu_sim::ring::{RingGuest, config};
use vpmu_sim::{Machine, SimVendor, Snapshot, amd_legacy, amd_v2, guest_frame, intel_v2, intel_v5};
use zerocopy::{FromBytes, IntoBytes};

const PRIVILEGED: VcpuId = VcpuId { domain: 0, vcpu: 0 };
const GUEST: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const VCPUS: u32 = 2;

/// The machine states the matrix runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Unavailable,
    Off,
    SelfIdle,
    SelfPages,
    SelfMsrUser,
    SelfCached,
    HvPages,
    All,
    AllCached,
    NoMappingRoom,
    /// Self mode; each domain's vCPU 0 has a page (frame 0) and a ring (`RING`), vCPU 1
    /// nothing.
    SelfRing,
    /// `SelfRing`, and each domain's vCPU 1 has a page inside the area of `IN_USE`.
    SelfRingPages,
    /// `SelfRing` on a platform that then stops offering rings.
    RingUnsupported,
}

/// Frame indices (`guest_frame(domain, index)`) the ring states use: a ring registered there
/// (1 data page); a valid configuration whose area holds `SelfRingPages`' vCPU 1 page; a
/// valid configuration nothing uses; an invalid configuration (3 data pages); no RAM.
const RING: u64 = 0x100;
const IN_USE: u64 = 0x110;
const FREE: u64 = 0x140;
const BAD_CONFIG: u64 = 0x120;
const NO_RAM: u64 = 0x130;

const STATES: [State; 13] = [
    State::Unavailable,
    State::Off,
    State::SelfIdle,
    State::SelfPages,
    State::SelfMsrUser,
    State::SelfCached,
    State::HvPages,
    State::All,
    State::AllCached,
    State::NoMappingRoom,
    State::SelfRing,
    State::SelfRingPages,
    State::RingUnsupported,
];

/// `running` retires one kernel instruction on pCPU 0, which must deliver a sample to `to`.
fn take_sample(m: &mut Machine<impl SimVendor>, running: VcpuId, to: VcpuId) {
    m.schedule(0, Some(running));
    let record = m.run(0, 1).pop().expect("a PMI");
    assert!(
        matches!(record.outcome, Some(PmiOutcome::Delivered { to: t, .. }) if t == to),
        "{record:?}"
    );
    m.platform.virqs.clear();
}

fn build<V: SimVendor>(vendor: &V, state: State) -> Machine<V> {
    let mode = match state {
        State::Unavailable | State::Off => XENPMU_MODE_OFF,
        State::HvPages => XENPMU_MODE_HV,
        State::All | State::AllCached => XENPMU_MODE_ALL,
        _ => XENPMU_MODE_SELF,
    };
    let domains = [VCPUS, VCPUS];
    let valid = config(1, 0, 0, &[(false, 0, 1000)]);
    let mut m = if state == State::Unavailable {
        Machine::with_vpmu(
            vendor.clone(),
            Vpmu::unavailable(vendor.backend(), 2),
            2,
            &domains,
        )
    } else {
        Machine::new(vendor.clone(), 2, &domains, mode)
    };
    // Every state has the ring configurations in its guests' memory.
    for domain in 0..2 {
        for (index, config) in [
            (RING, valid),
            (IN_USE, valid),
            (FREE, valid),
            (
                BAD_CONFIG,
                RingConfig {
                    data_pages: 3,
                    ..valid
                },
            ),
        ] {
            RingGuest::prepare(&mut m.platform, domain, guest_frame(domain, index), &config);
        }
    }
    match state {
        State::SelfPages | State::HvPages => {
            m.register_page(PRIVILEGED);
            m.register_page(GUEST);
        }
        State::SelfMsrUser => {
            m.schedule(1, Some(GUEST));
            m.program(GUEST, &[sampling(0, 1)]);
            m.schedule(1, None);
        }
        State::SelfCached => {
            for id in [PRIVILEGED, GUEST] {
                m.register_page(id);
                m.schedule(0, Some(id));
                m.program(id, &[sampling(0, 1)]);
                take_sample(&mut m, id, id);
            }
        }
        State::All | State::AllCached => {
            m.register_page(PRIVILEGED);
            m.program(PRIVILEGED, &[sampling(0, 1)]);
            if state == State::AllCached {
                take_sample(&mut m, GUEST, PRIVILEGED);
            }
        }
        State::NoMappingRoom => m.platform.mapping_limit = 0,
        State::SelfRing | State::SelfRingPages | State::RingUnsupported => {
            for domain in 0..2 {
                let id = VcpuId { domain, vcpu: 0 };
                m.register_page(id);
                let gfn = guest_frame(domain, RING);
                let init = m.op(id, XENPMU_OP_RING_INIT, &Params::new(gfn, 0));
                assert!(init.is_ok(), "{init:?}");
                if state == State::SelfRingPages {
                    let gfn = guest_frame(domain, IN_USE + 1);
                    let init = m.op(id, XENPMU_OP_INIT, &Params::new(gfn, 1));
                    assert!(init.is_ok(), "{init:?}");
                }
            }
            m.platform.ring_support = state != State::RingUnsupported;
        }
        State::Unavailable | State::Off | State::SelfIdle => {}
    }
    m
}

/// Whether this build has XENPMU_OP_COVERAGE (the vpmu crate's `coverage` feature, which
/// `--all-features` turns on): asked once through the operation itself.
fn coverage_built_in() -> bool {
    static BUILT_IN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BUILT_IN.get_or_init(|| {
        let mut m = build(&intel_v5(), State::Off);
        m.op(PRIVILEGED, XENPMU_OP_COVERAGE, &Params::new(0, 0)) != Err(OpError::NotSupported)
    })
}

/// XENPMU_OP_COVERAGE (docs/abi.md): no vPMU at all, or not built in → -EOPNOTSUPP for
/// everyone (step 1); else version, privilege, then the sub-operation (`_pad0`) with `val`
/// (buffer) and `vcpu` (size). The matrix never reads (its sub-operations are 0 = get_size and
/// 0xdead), so the core's state beyond its availability does not matter.
fn coverage_oracle(state: State, privileged: bool, p: &Params) -> Result<(), OpError> {
    use OpError::*;
    if state == State::Unavailable || !coverage_built_in() {
        return Err(NotSupported);
    }
    if p.version.major != u32::from(XENPMU_VERSION_MAJOR) {
        return Err(VersionMismatch);
    }
    if !privileged {
        return Err(NotPrivileged);
    }
    let c = CoverageParams::from(*p);
    match c.subop {
        XENPMU_COVERAGE_GET_SIZE if c.buffer == 0 && c.size == 0 => Ok(()),
        _ => Err(InvalidArgument),
    }
}

/// What docs/abi.md says the call must return.
fn oracle<V: SimVendor>(
    m: &Machine<V>,
    state: State,
    caller: VcpuId,
    op: u32,
    p: &Params,
) -> Result<(), OpError> {
    use OpError::*;
    if op == XENPMU_OP_COVERAGE {
        return coverage_oracle(state, caller == PRIVILEGED, p);
    }
    // 1. Operation known, vPMU present (and rings offered, for the ring operations).
    if op > XENPMU_OP_RING_FINISH || state == State::Unavailable {
        return Err(NotSupported);
    }
    let ring_op = matches!(op, XENPMU_OP_RING_INIT | XENPMU_OP_RING_FINISH);
    if ring_op && state == State::RingUnsupported {
        return Err(NotSupported);
    }
    // 2. Version (mode_get is how a caller discovers it).
    if op != XENPMU_OP_MODE_GET && p.version.major != u32::from(XENPMU_VERSION_MAJOR) {
        return Err(VersionMismatch);
    }
    // 3. Privilege.
    let privileged = caller.domain == m.platform.privileged;
    if matches!(op, XENPMU_OP_MODE_SET | XENPMU_OP_FEATURE_SET) && !privileged {
        return Err(NotPrivileged);
    }
    // 4. Arguments.
    let takes_vcpu = matches!(op, XENPMU_OP_INIT | XENPMU_OP_FINISH) || ring_op;
    if p._pad0 != 0 || (!takes_vcpu && p.vcpu != 0) {
        return Err(InvalidArgument);
    }
    if matches!(
        op,
        XENPMU_OP_LVTPC_SET | XENPMU_OP_FLUSH | XENPMU_OP_RING_FINISH
    ) && p.val != 0
    {
        return Err(InvalidArgument);
    }
    let target = VcpuId {
        domain: caller.domain,
        vcpu: if takes_vcpu { p.vcpu } else { caller.vcpu },
    };
    if target.vcpu >= m.platform.vcpu_counts[caller.domain as usize] {
        return Err(InvalidArgument);
    }
    let mode = m.vpmu.mode().to_abi();
    let busy = m.vpmu.unprivileged_in_use() > 0;
    let page = m.vcpu(target).page().is_some();
    match op {
        XENPMU_OP_MODE_SET => {
            if p.val & !XENPMU_MODE_MASK != 0 || p.val.count_ones() > 1 {
                return Err(InvalidArgument);
            }
            let self_hv = mode ^ p.val == XENPMU_MODE_SELF | XENPMU_MODE_HV;
            if p.val != mode && busy && !self_hv {
                return Err(Busy);
            }
        }
        XENPMU_OP_FEATURE_SET => {
            let known =
                XENPMU_FEATURE_INTEL_BTS | XENPMU_FEATURE_IPC_ONLY | XENPMU_FEATURE_ARCH_ONLY;
            if p.val & !known != 0 {
                return Err(InvalidArgument);
            }
            if p.val != 0 && !m.vendor.driver().is_intel() {
                return Err(NotSupported);
            }
            if p.val != m.vpmu.features() && busy {
                return Err(Busy);
            }
        }
        XENPMU_OP_INIT => {
            if !m.platform.memory.contains_key(&(caller.domain, p.val)) {
                return Err(InvalidArgument);
            }
            let has_vpmu = match mode {
                XENPMU_MODE_SELF | XENPMU_MODE_HV => true,
                XENPMU_MODE_ALL => privileged,
                _ => false,
            };
            if !has_vpmu {
                return Err(NoVpmu);
            }
            if page {
                return Err(AlreadyRegistered);
            }
            let frame = (caller.domain, p.val);
            let in_ring = m.platform.rings.values().any(|r| {
                r.domain == caller.domain && (r.gfn..r.gfn + u64::from(r.frames)).contains(&p.val)
            });
            if m.platform.mappings.values().any(|&mapped| mapped == frame) || in_ring {
                return Err(FrameInUse);
            }
            if m.platform.mappings.len() >= m.platform.mapping_limit {
                return Err(MapFailed);
            }
        }
        XENPMU_OP_RING_INIT => return ring_init_oracle(m, caller, target, p.val),
        XENPMU_OP_RING_FINISH if m.vcpu(target).ring().is_none() => return Err(NoVpmu),
        XENPMU_OP_FINISH | XENPMU_OP_LVTPC_SET if !page => return Err(NoVpmu),
        XENPMU_OP_FLUSH => {
            if !page {
                return Err(NoVpmu);
            }
            if !matches!(m.vcpu(target).state(), VcpuState::Cached { .. }) {
                return Err(InvalidArgument);
            }
        }
        _ => {}
    }
    Ok(())
}

/// RING_INIT's arguments and state, from docs/abi.md ("The operations" of the ring): the
/// configuration, read from the guest's memory, then the frames; then no page, a ring
/// already, the area in use (any page of the domain, another vCPU's ring), a sample cached.
fn ring_init_oracle<V: SimVendor>(
    m: &Machine<V>,
    caller: VcpuId,
    target: VcpuId,
    gfn: u64,
) -> Result<(), OpError> {
    use OpError::*;
    let Some(config) = m.platform.memory.get(&(caller.domain, gfn)).map(|page| {
        RingConfig::read_from_prefix(page.as_bytes())
            .expect("a page holds a configuration")
            .0
    }) else {
        return Err(InvalidArgument);
    };
    let pages = config.data_pages;
    let periods_valid = config.period_gp[1..].iter().all(|&p| p == 0)
        && config.period_fixed.iter().all(|&p| p == 0)
        && config.period_gp[0] < 1 << 31;
    let valid = pages.is_power_of_two()
        && pages <= 256
        && config.wakeup_bytes <= pages * 4096
        && config.flags == 0
        && config
            ._reserved0
            .iter()
            .chain(&config._reserved1)
            .all(|&w| w == 0)
        && periods_valid;
    let area = gfn..gfn + 1 + u64::from(pages);
    if !valid
        || !area
            .clone()
            .all(|f| m.platform.memory.contains_key(&(caller.domain, f)))
    {
        return Err(InvalidArgument);
    }
    let vcpu = m.vcpu(target);
    let has_vpmu = match m.vpmu.mode().to_abi() {
        XENPMU_MODE_SELF | XENPMU_MODE_HV => true,
        XENPMU_MODE_ALL => caller.domain == m.platform.privileged,
        _ => false,
    };
    if !has_vpmu || vcpu.page().is_none() {
        return Err(NoVpmu);
    }
    if vcpu.ring().is_some() {
        return Err(AlreadyRegistered);
    }
    let page_in_area = m
        .platform
        .mappings
        .values()
        .any(|&(domain, frame)| domain == caller.domain && area.contains(&frame));
    let ring_in_area = m.platform.rings.values().any(|r| {
        r.domain == caller.domain && r.gfn < area.end && area.start < r.gfn + u64::from(r.frames)
    });
    if page_in_area || ring_in_area {
        return Err(FrameInUse);
    }
    if matches!(vcpu.state(), VcpuState::Cached { .. }) {
        return Err(Busy);
    }
    Ok(())
}

/// The `val`s worth trying for `op` by `caller`.
fn values(op: u32, caller: VcpuId) -> Vec<u64> {
    match op {
        XENPMU_OP_MODE_GET | XENPMU_OP_FEATURE_GET => vec![0, 0x1234],
        XENPMU_OP_MODE_SET => vec![
            XENPMU_MODE_OFF,
            XENPMU_MODE_SELF,
            XENPMU_MODE_HV,
            XENPMU_MODE_ALL,
            XENPMU_MODE_SELF | XENPMU_MODE_HV,
            1 << 3,
            1 << 63,
        ],
        XENPMU_OP_FEATURE_SET => vec![
            0,
            XENPMU_FEATURE_INTEL_BTS,
            XENPMU_FEATURE_IPC_ONLY,
            XENPMU_FEATURE_ARCH_ONLY,
            XENPMU_FEATURE_INTEL_BTS | XENPMU_FEATURE_IPC_ONLY | XENPMU_FEATURE_ARCH_ONLY,
            1 << 3,
        ],
        XENPMU_OP_INIT => vec![
            guest_frame(caller.domain, 3),
            guest_frame(caller.domain, 0),
            guest_frame(1 - caller.domain, 3),
            guest_frame(caller.domain, RING + 1),
            0,
        ],
        XENPMU_OP_RING_INIT => [RING, IN_USE, FREE, BAD_CONFIG, NO_RAM]
            .map(|index| guest_frame(caller.domain, index))
            .into_iter()
            .chain([guest_frame(1 - caller.domain, FREE), u64::MAX])
            .collect(),
        XENPMU_OP_FINISH | XENPMU_OP_RING_FINISH => vec![0, 7],
        _ => vec![0, 1],
    }
}

/// The documented effect of a successful call.
fn check_success<V: SimVendor>(
    before: &Snapshot,
    m: &Machine<V>,
    caller: VcpuId,
    op: u32,
    p: &Params,
    out: &Params,
) {
    let mut expected_out = *p;
    let target = VcpuId {
        domain: caller.domain,
        vcpu: p.vcpu,
    };
    match op {
        XENPMU_OP_MODE_GET => {
            expected_out.val = before.mode;
            expected_out.version.major = u32::from(XENPMU_VERSION_MAJOR);
            expected_out.version.minor = u32::from(XENPMU_VERSION_MINOR);
        }
        XENPMU_OP_FEATURE_GET => expected_out.val = before.features,
        XENPMU_OP_MODE_SET => assert_eq!(m.vpmu.mode().to_abi(), p.val),
        XENPMU_OP_FEATURE_SET => assert_eq!(m.vpmu.features(), p.val),
        XENPMU_OP_INIT => {
            assert!(m.vcpu(target).page().is_some());
            let page = m.platform.frame(caller.domain, p.val);
            let view = PageView::new(page).expect("a valid header");
            assert!(!view.is_cached() && view.lvtpc() & vpmu::abi::XENPMU_LVTPC_MASKED != 0);
        }
        XENPMU_OP_FINISH => {
            assert_eq!(m.vcpu(target).page(), None);
            assert_eq!(m.vcpu(target).state(), VcpuState::Allocated);
        }
        XENPMU_OP_FLUSH => assert!(!matches!(m.vcpu(caller).state(), VcpuState::Cached { .. })),
        XENPMU_OP_RING_INIT => {
            assert_eq!(m.vcpu(target).ring().map(|r| r.gfn), Some(p.val));
            let ring = RingGuest {
                domain: caller.domain,
                gfn: p.val,
                data_pages: 1,
                tail: 0,
            };
            let control = ring.control(&m.platform);
            assert_eq!(control.info.magic, XENPMU_RING_MAGIC);
            assert_eq!((control.producer, control.consumer), Default::default());
        }
        XENPMU_OP_RING_FINISH => assert_eq!(m.vcpu(target).ring(), None),
        XENPMU_OP_COVERAGE => {
            // get_size: OUT size, at least a raw profile's 128-byte header.
            assert!(CoverageParams::from(*out).size >= 128, "{out:?}");
            expected_out.vcpu = out.vcpu;
        }
        _ => {}
    }
    assert_eq!(*out, expected_out, "OUT fields of op {op}");
    if matches!(
        op,
        XENPMU_OP_MODE_GET | XENPMU_OP_FEATURE_GET | XENPMU_OP_COVERAGE
    ) {
        assert_eq!(*before, Snapshot::take(m), "a query changes nothing");
    }
}

/// The return value of a result (0 or a negative errno).
fn code(result: Result<(), OpError>) -> i64 {
    result.map_or_else(OpError::return_value, |()| 0)
}

/// Runs the matrix; returns, per (operation, result), how many calls had it.
fn matrix<V: SimVendor>(vendor: V) -> BTreeMap<(u32, i64), usize> {
    let mut tally = BTreeMap::new();
    let ops = (0..=XENPMU_OP_COUNT).chain([u32::MAX]);
    for state in STATES {
        for caller in [PRIVILEGED, GUEST] {
            for op in ops.clone() {
                for major in [1, 0, 2] {
                    for pad in [0, 0xdead] {
                        for vcpu in [0, 1, VCPUS, u32::MAX] {
                            for val in values(op, caller) {
                                let mut p = Params::new(val, vcpu);
                                p.version.major = major;
                                p._pad0 = pad;
                                let mut m = build(&vendor, state);
                                let expected = oracle(&m, state, caller, op, &p);
                                let before = Snapshot::take(&m);
                                let result = m.op(caller, op, &p);
                                let what = format!(
                                    "{}: {state:?}, {caller:?}, op {op}, {p:?}",
                                    vendor.name()
                                );
                                assert_eq!(result.map(|_| ()), expected, "{what}");
                                *tally
                                    .entry((op.min(XENPMU_OP_COUNT), code(expected)))
                                    .or_default() += 1;
                                match result {
                                    Err(_) => {
                                        assert_eq!(
                                            before,
                                            Snapshot::take(&m),
                                            "{what}: state changed"
                                        );
                                    }
                                    Ok(out) => check_success(&before, &m, caller, op, &p, &out),
                                }
                                m.assert_conservation();
                            }
                        }
                    }
                }
            }
        }
    }
    tally
}

/// Every operation must have been seen succeeding and failing with each error its row of the
/// table lists (so the matrix's states reach them all).
fn assert_reached(tally: &BTreeMap<(u32, i64), usize>, amd: bool) {
    use OpError::*;
    let common = [NotSupported, VersionMismatch, InvalidArgument];
    let per_op: [(u32, &[OpError]); 12] = [
        (XENPMU_OP_MODE_GET, &[]),
        (XENPMU_OP_MODE_SET, &[NotPrivileged, Busy]),
        (XENPMU_OP_FEATURE_GET, &[]),
        (XENPMU_OP_FEATURE_SET, &[NotPrivileged, Busy]),
        (
            XENPMU_OP_INIT,
            &[NoVpmu, AlreadyRegistered, FrameInUse, MapFailed],
        ),
        (XENPMU_OP_FINISH, &[NoVpmu]),
        (XENPMU_OP_LVTPC_SET, &[NoVpmu]),
        (XENPMU_OP_FLUSH, &[NoVpmu]),
        (XENPMU_OP_COVERAGE, &[]),
        (
            XENPMU_OP_RING_INIT,
            &[NoVpmu, AlreadyRegistered, FrameInUse, Busy],
        ),
        (XENPMU_OP_RING_FINISH, &[NoVpmu]),
        (XENPMU_OP_COUNT, &[]),
    ];
    for (op, errors) in per_op {
        let mut wanted: Vec<Result<(), OpError>> = errors.iter().map(|e| Err(*e)).collect();
        if op < XENPMU_OP_COVERAGE || op == XENPMU_OP_RING_INIT || op == XENPMU_OP_RING_FINISH {
            wanted.push(Ok(()));
            wanted.extend(common.iter().map(|e| Err(*e)));
        } else if op == XENPMU_OP_COVERAGE && coverage_built_in() {
            wanted.extend([
                Ok(()),
                Err(VersionMismatch),
                Err(NotPrivileged),
                Err(InvalidArgument),
            ]);
        } else {
            wanted.push(Err(NotSupported));
        }
        if op == XENPMU_OP_MODE_GET {
            wanted.retain(|r| *r != Err(VersionMismatch));
        }
        if op == XENPMU_OP_FEATURE_SET && amd {
            wanted.retain(|r| *r != Err(Busy));
            wanted.push(Err(NotSupported));
        }
        for result in wanted {
            assert!(
                tally.contains_key(&(op, code(result))),
                "op {op} never gave {result:?}"
            );
        }
    }
}

fn print(name: &str, tally: &BTreeMap<(u32, i64), usize>) {
    let total: usize = tally.values().sum();
    println!("{name}: {total} calls");
    for ((op, result), count) in tally {
        let result = OpError::from_return_value(*result).expect("an errno");
        println!("  op {op:>2} {:<28} {count:>5}", format!("{result:?}"));
    }
}

#[test]
fn op_matrix_intel_v5() {
    let tally = matrix(intel_v5());
    print(&intel_v5().name(), &tally);
    assert_reached(&tally, false);
}

#[test]
fn op_matrix_intel_v2() {
    assert_reached(&matrix(intel_v2()), false);
}

#[test]
fn op_matrix_amd_v2() {
    let tally = matrix(amd_v2());
    print(&amd_v2().name(), &tally);
    assert_reached(&tally, true);
}

#[test]
fn op_matrix_amd_legacy() {
    assert_reached(&matrix(amd_legacy()), true);
}
