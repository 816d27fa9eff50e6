//! The control operations' privilege / argument / version matrix.
//!
//! Every operation number (0–7, plus 8 and `u32::MAX`) × caller (privileged, unprivileged) ×
//! `version.major` (1, 0, 2) × `_pad0` (0, non-zero) × `vcpu` (0, 1, out of range, `u32::MAX`)
//! × the operation's interesting `val`s, in each of a set of machine states (vPMU unavailable;
//! mode off; self with nothing in use, with pages, with an unprivileged MSR user, with samples
//! cached; hv; all, with a sample cached; no room to map a page). The expected result comes
//! from an oracle written from docs/abi.md alone: its check order (operation, version,
//! privilege, arguments, state) and its per-operation error table. Every failing call must
//! leave the whole observable state unchanged (`Snapshot`); every successful one must have its
//! documented effect and OUT fields.

use std::collections::BTreeMap;

use vpmu::abi::ops::{CoverageParams, OpError, Params, XENPMU_COVERAGE_GET_SIZE};
use vpmu::abi::{
    PageView, XENPMU_FEATURE_ARCH_ONLY, XENPMU_FEATURE_INTEL_BTS, XENPMU_FEATURE_IPC_ONLY,
    XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_MASK, XENPMU_MODE_OFF, XENPMU_MODE_SELF,
    XENPMU_OP_COUNT, XENPMU_OP_COVERAGE, XENPMU_OP_FEATURE_GET, XENPMU_OP_FEATURE_SET,
    XENPMU_OP_FINISH, XENPMU_OP_FLUSH, XENPMU_OP_INIT, XENPMU_OP_LVTPC_SET, XENPMU_OP_MODE_GET,
    XENPMU_OP_MODE_SET, XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR,
};
use vpmu::{PmiOutcome, VcpuId, VcpuState, Vpmu};
use vpmu_sim::helpers::sampling;
use vpmu_sim::{Machine, SimVendor, Snapshot, amd_legacy, amd_v2, guest_frame, intel_v2, intel_v5};

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
}

const STATES: [State; 10] = [
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
    // 1. Operation known, vPMU present.
    if op > XENPMU_OP_FLUSH || state == State::Unavailable {
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
    let takes_vcpu = matches!(op, XENPMU_OP_INIT | XENPMU_OP_FINISH);
    if p._pad0 != 0 || (!takes_vcpu && p.vcpu != 0) {
        return Err(InvalidArgument);
    }
    if matches!(op, XENPMU_OP_LVTPC_SET | XENPMU_OP_FLUSH) && p.val != 0 {
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
            if m.platform.mappings.values().any(|&mapped| mapped == frame) {
                return Err(FrameInUse);
            }
            if m.platform.mappings.len() >= m.platform.mapping_limit {
                return Err(MapFailed);
            }
        }
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
            0,
        ],
        XENPMU_OP_FINISH => vec![0, 7],
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
    let per_op: [(u32, &[OpError]); 10] = [
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
        (XENPMU_OP_COUNT, &[]),
    ];
    for (op, errors) in per_op {
        let mut wanted: Vec<Result<(), OpError>> = errors.iter().map(|e| Err(*e)).collect();
        if op < XENPMU_OP_COVERAGE {
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
