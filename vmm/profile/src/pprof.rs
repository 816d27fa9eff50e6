//! pprof's `profile.proto` (github.com/google/pprof, `proto/profile.proto`) as `prost`
//! messages, declared here with `prost`'s derive: the fields pprof reads of eight
//! messages need no code generator (no `protoc` at build time), and the crates that ship these
//! messages bring a whole in-process profiler with them. `go tool pprof` reads the gzipped
//! encoding `encode_gz` writes (the CLI's tests run it).

use std::io::Write as _;

use prost::Message;

/// `perftools.profiles.Profile`.
#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    /// What each sample value is.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// The mapped binaries.
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// The addresses the samples name.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// The functions the locations are in.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Every string, index 0 the empty one.
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// Time of collection, ns since the epoch.
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// Duration, ns.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// The event between samples.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// Events between samples.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Free-form comments (string table indices).
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
}

/// `ValueType`: a type and a unit, as string table indices.
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct ValueType {
    /// Type (`samples`, `cycles`).
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// Unit (`count`).
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `Sample`: a stack (leaf first), its values and labels.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// Location ids, the sampled one first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per `sample_type`.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    /// Labels.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// `Label`: a key with a string or a number.
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct Label {
    /// Key (string index).
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// String value (string index), or 0.
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// Numeric value.
    #[prost(int64, tag = "3")]
    pub num: i64,
    /// The numeric value's unit (string index). pprof drops a numeric label whose value and
    /// unit are both 0 (proto3 does not encode zeros, and its reader cannot tell "0" from
    /// "absent"), so a numeric label whose value may be 0 needs a unit.
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// `Mapping`: a binary mapped at `[memory_start, memory_limit)`.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Mapping {
    /// Id (non-zero).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Start address.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// End address (exclusive).
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// File offset of `memory_start`.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// The binary (string index).
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// Its build id, hex (string index).
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// The locations already name their functions.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
}

/// `Location`: an address and the function it is in.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct Location {
    /// Id (non-zero).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Its mapping.
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// The address (a return address for callers).
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// The function (one line: no inlining information).
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

/// `Line`: a function (and line, unknown here).
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct Line {
    /// The function's id.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// Source line (0: unknown).
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// `Function`.
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct Function {
    /// Id (non-zero).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Name (string index).
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// System name (string index).
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// Source file (string index).
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// The string table being built: `intern` gives a string's index, adding it once.
#[derive(Debug)]
pub struct Strings {
    table: Vec<String>,
    index: std::collections::HashMap<String, i64>,
}

impl Default for Strings {
    fn default() -> Self {
        Strings {
            table: vec![String::new()],
            index: std::collections::HashMap::from([(String::new(), 0)]),
        }
    }
}

impl Strings {
    /// The index of `s`.
    pub fn intern(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }

    /// The table, index 0 the empty string.
    pub fn into_table(self) -> Vec<String> {
        self.table
    }
}

/// The profile's protobuf encoding, gzipped (what pprof writes and reads).
pub fn encode_gz(profile: &Profile) -> std::io::Result<Vec<u8>> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    #[test]
    fn round_trips_through_gzip_and_protobuf() {
        let mut strings = Strings::default();
        let samples = strings.intern("samples");
        let count = strings.intern("count");
        assert_eq!(strings.intern("samples"), samples);
        let f = strings.intern("w1_deflate");
        let profile = Profile {
            sample_type: vec![ValueType {
                r#type: samples,
                unit: count,
            }],
            sample: vec![Sample {
                location_id: vec![1],
                value: vec![3],
                label: vec![],
            }],
            location: vec![Location {
                id: 1,
                mapping_id: 0,
                address: 0x1000,
                line: vec![Line {
                    function_id: 1,
                    line: 0,
                }],
            }],
            function: vec![Function {
                id: 1,
                name: f,
                system_name: f,
                filename: 0,
            }],
            string_table: strings.into_table(),
            ..Profile::default()
        };
        let gz = encode_gz(&profile).expect("encodes");
        assert_eq!(&gz[..2], [0x1f, 0x8b]);
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut raw)
            .expect("gunzips");
        let back = Profile::decode(&raw[..]).expect("decodes");
        assert_eq!(back, profile);
        assert_eq!(back.string_table[0], "");
        assert_eq!(back.string_table[f as usize], "w1_deflate");
    }
}
