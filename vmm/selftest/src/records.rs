//! The structured result channel of the conformance suite, after KVM selftests' "ucall": each
//! check a guest makes is a fixed-layout `struct guest_result` (`vpmu_guest_protocol::selftest`)
//! in its memory, whose address it writes to `port::RESULT`. `ResultPort` copies each record
//! out of guest memory and validates it; the suite counts passes and failures from these
//! records (the console's PASS/FAIL lines are for people and `-v`).

use std::collections::BTreeMap;
use std::sync::Mutex;

use vpmu::VcpuId;
use vpmu_guest_protocol::port;
use vpmu_guest_protocol::selftest::{Kind, RESULT_MAGIC, RESULT_MESSAGE_SIZE, RESULT_RECORD_SIZE};
use vpmu_machine::{GuestPorts, PortAccess};

/// The most records one vCPU may send in one case (the largest case sends ~60).
pub const MAX_RECORDS_PER_VCPU: usize = 4096;

/// One result record, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResultRecord {
    /// What it reports.
    pub kind: Kind,
    /// The case number the guest was entered with.
    pub case_id: u32,
    /// The check's number (1, 2, ... per vCPU); on a `Done` record, how many the vCPU reported.
    pub check: u32,
    /// The check's name and values, or the case's name (`Begin`).
    pub message: String,
}

/// Why a result record was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The bytes are not one record.
    #[error("result record of {0} bytes (a record has {RESULT_RECORD_SIZE})")]
    Size(usize),
    /// The magic is not `RESULT_MAGIC`.
    #[error("result record magic {0:#x} (want {RESULT_MAGIC:#x})")]
    Magic(u32),
    /// The kind is none of the protocol's.
    #[error("result record kind {0} (want BEGIN, PASS, FAIL, SKIP or DONE)")]
    Kind(u32),
    /// The message has no NUL within its field.
    #[error("result record message longer than {} bytes (no NUL)", RESULT_MESSAGE_SIZE - 1)]
    Oversize,
    /// The message is not UTF-8.
    #[error("result record message is not UTF-8")]
    NotUtf8,
    /// The record's address is not guest RAM.
    #[error("result record at {0:#x} is outside guest memory")]
    Outside(u64),
    /// A vCPU sent more records than a case can have.
    #[error("more than {MAX_RECORDS_PER_VCPU} result records from one vCPU")]
    TooMany,
}

impl ResultRecord {
    /// Decodes the `RESULT_RECORD_SIZE` bytes of a `struct guest_result`.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        if bytes.len() != RESULT_RECORD_SIZE {
            return Err(RecordError::Size(bytes.len()));
        }
        let word =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let magic = word(0);
        if magic != RESULT_MAGIC {
            return Err(RecordError::Magic(magic));
        }
        let kind = Kind::from_raw(word(4)).ok_or(RecordError::Kind(word(4)))?;
        let field = &bytes[16..16 + RESULT_MESSAGE_SIZE];
        let len = field
            .iter()
            .position(|&b| b == 0)
            .ok_or(RecordError::Oversize)?;
        let message = std::str::from_utf8(&field[..len])
            .map_err(|_| RecordError::NotUtf8)?
            .to_string();
        Ok(Self {
            kind,
            case_id: word(8),
            check: word(12),
            message,
        })
    }
}

/// The suite's port on the machine (`vpmu_machine::GuestPorts`): each `outl(port::RESULT, gpa)`
/// copies the record at `gpa` out of the writer's memory, validates it and keeps it per vCPU.
/// A record that is not guest RAM or not valid ends the writer's run with the error.
#[derive(Debug, Default)]
pub struct ResultPort {
    records: Mutex<BTreeMap<VcpuId, Vec<ResultRecord>>>,
}

impl ResultPort {
    /// The records each vCPU sent, in order.
    pub fn take(&self) -> BTreeMap<VcpuId, Vec<ResultRecord>> {
        std::mem::take(&mut *self.records.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn receive(&self, access: PortAccess<'_>, gpa: u64) -> Result<(), RecordError> {
        let bytes = access
            .memory
            .to_vec(gpa, RESULT_RECORD_SIZE)
            .ok_or(RecordError::Outside(gpa))?;
        let record = ResultRecord::decode(&bytes)?;
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let mine = records.entry(access.vcpu).or_default();
        if mine.len() >= MAX_RECORDS_PER_VCPU {
            return Err(RecordError::TooMany);
        }
        mine.push(record);
        Ok(())
    }
}

impl GuestPorts for ResultPort {
    fn out(&self, access: PortAccess<'_>, port: u16, value: u32) -> Result<(), String> {
        if port != port::RESULT {
            return Ok(());
        }
        self.receive(access, u64::from(value))
            .map_err(|e| e.to_string())
    }
}

/// A case's results as its records tell them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// The case's name (its first `Begin` record).
    pub case: Option<String>,
    /// Checks passed.
    pub passed: u32,
    /// Checks failed.
    pub failed: u32,
    /// Checks that did not apply.
    pub skipped: u32,
    /// The failed checks (`FAIL name (got .., want ..)`) and protocol violations.
    pub failures: Vec<String>,
    /// Violations of the protocol (a record of another case, checks out of order, a missing or
    /// wrong `Done`): each also counts as a failure.
    pub violations: u32,
}

/// Counts the records of case `case_id`, vCPU by vCPU. Each vCPU's checks must be numbered
/// 1, 2, ... and, if it reported any, end with a `Done` record carrying their number.
pub fn tally(case_id: u64, records: &BTreeMap<VcpuId, Vec<ResultRecord>>) -> Tally {
    let mut t = Tally::default();
    let violation = |t: &mut Tally, what: String| {
        t.violations += 1;
        t.failures.push(what);
    };
    for (vcpu, recs) in records {
        let who = format!("domain {} vCPU {}", vcpu.domain, vcpu.vcpu);
        let mut checks = 0u32;
        let mut done = None;
        for r in recs {
            if u64::from(r.case_id) != case_id {
                violation(
                    &mut t,
                    format!("{who}: a record of case {} in case {case_id}", r.case_id),
                );
            }
            if done.is_some() {
                violation(&mut t, format!("{who}: a record after DONE: {}", r.message));
            }
            match r.kind {
                Kind::Begin => {
                    t.case.get_or_insert_with(|| r.message.clone());
                    continue;
                }
                Kind::Done => {
                    done = Some(r.check);
                    continue;
                }
                Kind::Pass => t.passed += 1,
                Kind::Fail => {
                    t.failed += 1;
                    t.failures.push(format!("FAIL {}", r.message));
                }
                Kind::Skip => t.skipped += 1,
            }
            checks += 1;
            if r.check != checks {
                violation(
                    &mut t,
                    format!("{who}: check {} reported as number {}", checks, r.check),
                );
                checks = r.check;
            }
        }
        match done {
            Some(n) if n != checks => violation(
                &mut t,
                format!("{who}: DONE says {n} checks, {checks} were reported"),
            ),
            None if checks > 0 => violation(
                &mut t,
                format!("{who}: no DONE record (the case did not finish)"),
            ),
            _ => {}
        }
    }
    t.failed += t.violations;
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use vpmu_guest_protocol::selftest::{RESULT_FAIL, RESULT_PASS};

    fn raw(magic: u32, kind: u32, case_id: u32, check: u32, message: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        for w in [magic, kind, case_id, check] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        let mut m = message.to_vec();
        m.resize(RESULT_MESSAGE_SIZE, 0);
        b.extend_from_slice(&m);
        b
    }

    fn rec(kind: Kind, case_id: u32, check: u32, message: &str) -> ResultRecord {
        ResultRecord {
            kind,
            case_id,
            check,
            message: message.into(),
        }
    }

    #[test]
    fn decodes_a_record_and_refuses_bad_ones() {
        let r = ResultRecord::decode(&raw(RESULT_MAGIC, RESULT_FAIL, 7, 3, b"x (got 1, want 2)"))
            .expect("valid");
        assert_eq!(r, rec(Kind::Fail, 7, 3, "x (got 1, want 2)"));
        let full = vec![b'a'; RESULT_MESSAGE_SIZE - 1];
        assert_eq!(
            ResultRecord::decode(&raw(RESULT_MAGIC, RESULT_PASS, 0, 1, &full))
                .expect("longest message")
                .message
                .len(),
            RESULT_MESSAGE_SIZE - 1
        );
        let mut oversize = raw(RESULT_MAGIC, RESULT_PASS, 0, 1, b"");
        oversize[16..].fill(b'a');
        assert_eq!(ResultRecord::decode(&oversize), Err(RecordError::Oversize));
        assert_eq!(
            ResultRecord::decode(&raw(RESULT_MAGIC, 9, 0, 1, b"x")),
            Err(RecordError::Kind(9))
        );
        assert_eq!(
            ResultRecord::decode(&raw(RESULT_MAGIC, 0, 0, 1, b"x")),
            Err(RecordError::Kind(0))
        );
        assert_eq!(
            ResultRecord::decode(&raw(1, RESULT_PASS, 0, 1, b"x")),
            Err(RecordError::Magic(1))
        );
        assert_eq!(
            ResultRecord::decode(&raw(RESULT_MAGIC, RESULT_PASS, 0, 1, b"\xff\xfe")),
            Err(RecordError::NotUtf8)
        );
        assert_eq!(ResultRecord::decode(&[0; 12]), Err(RecordError::Size(12)));
        assert!(
            RecordError::Oversize
                .to_string()
                .contains("longer than 111"),
            "{}",
            RecordError::Oversize
        );
    }

    #[test]
    fn tallies_checks_and_names_protocol_violations() {
        let v0 = VcpuId { domain: 0, vcpu: 0 };
        let v1 = VcpuId { domain: 1, vcpu: 0 };
        let mut records = BTreeMap::new();
        records.insert(
            v0,
            vec![
                rec(Kind::Begin, 300, 0, "two_domains"),
                rec(Kind::Pass, 300, 1, "a"),
                rec(Kind::Fail, 300, 2, "b (got 1, want 2)"),
                rec(Kind::Skip, 300, 3, "c"),
                rec(Kind::Done, 300, 3, "done"),
            ],
        );
        records.insert(
            v1,
            vec![
                rec(Kind::Begin, 300, 0, "two_domains"),
                rec(Kind::Pass, 300, 1, "a"),
                rec(Kind::Done, 300, 1, "done"),
            ],
        );
        let t = tally(300, &records);
        assert_eq!(t.case.as_deref(), Some("two_domains"));
        assert_eq!((t.passed, t.failed, t.skipped, t.violations), (2, 1, 1, 0));
        assert_eq!(t.failures, ["FAIL b (got 1, want 2)"]);

        // Another case's record, a gap in the numbering, a wrong DONE, a missing DONE.
        records.insert(
            v0,
            vec![
                rec(Kind::Pass, 301, 1, "a"),
                rec(Kind::Pass, 300, 3, "b"),
                rec(Kind::Done, 300, 5, "done"),
            ],
        );
        records.insert(v1, vec![rec(Kind::Pass, 300, 1, "a")]);
        let t = tally(300, &records);
        assert_eq!(t.violations, 4, "{:?}", t.failures);
        assert_eq!(t.failed, 4);
        assert!(t.failures.iter().any(|f| f.contains("no DONE")));
        assert!(t.failures.iter().any(|f| f.contains("record of case 301")));
    }

    proptest::proptest! {
        /// Records come from a guest: any bytes decode to a record or an error, never a panic.
        #[test]
        fn arbitrary_records_never_panic(
            bytes in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..200),
        ) {
            let _ = ResultRecord::decode(&bytes);
        }
    }
}
