//! The pod as templates see it ([`PodContext`]), handed to minijinja as objects that note what a render reads
//! of it, and the record of those reads ([`Dependencies`]): what a cached render keys on.
//!
//! A render is a pure function of the answers the pod gives it: a field's value, a label's value or its absence,
//! a whole map (iterated, printed or measured), the containers. A pod that gives the same answer to every read a
//! render made would be rendered the same way, read for read, so the cached output is its output. Keying on the
//! reads, not on every field a template names, lets pods that differ only in what a render did not look at share
//! an entry: a StatefulSet's pods (each named, with a `pod-name` label), or pods named before admission, when the
//! template reads the name only when no label names the service.

use std::hash::Hasher;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use minijinja::Value;
use simd_json::prelude::{ValueAsScalar, ValueIntoString};
use simd_json::tape::Value as TapeValue;

use crate::pod::PodView;
use minijinja::value::{Enumerator, Object, ObjectRepr, Serde};

/// The pod as templates see it: `pod.name`, `pod.generateName`, `pod.namespace`, `pod.serviceAccountName`,
/// `pod.labels`, `pod.annotations` and `pod.containers`.
#[derive(Debug)]
pub(crate) struct PodContext<'a, M: StrEntries, C: ContainerEntries> {
    pub name: &'a str,
    pub generate_name: &'a str,
    pub namespace: &'a str,
    pub service_account_name: &'a str,
    pub labels: M,
    pub annotations: M,
    pub containers: C,
}

/// A string-to-string map of the pod (its labels or annotations), read in the pod's order.
pub(crate) trait StrEntries {
    fn entries(&self) -> impl Iterator<Item = (&str, &str)>;
}

impl StrEntries for std::collections::BTreeMap<&str, &str> {
    fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        self.iter().map(|(k, v)| (*k, *v))
    }
}

/// A port of one of the pod's containers, as templates see it: `pod.containers[i].ports[j]`, with `name` when
/// the port has one and `protocol` as the API server defaults it (`TCP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Port<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<&'a str>,
    pub container_port: i64,
    pub protocol: &'a str,
}

/// The pod's own containers (`spec.containers`, as the pod was sent), each name with its ports, in the pod's
/// order.
pub(crate) trait ContainerEntries {
    fn entries(&self) -> impl Iterator<Item = (&str, impl Iterator<Item = Port<'_>>)>;
}

/// A list of containers written out, for sample pods and tests.
impl ContainerEntries for Vec<(&str, Vec<Port<'_>>)> {
    fn entries(&self) -> impl Iterator<Item = (&str, impl Iterator<Item = Port<'_>>)> {
        self.iter().map(|(name, ports)| {
            let ports =
                ports.iter().map(|p| Port { name: p.name, container_port: p.container_port, protocol: p.protocol });
            (*name, ports)
        })
    }
}

/// The names templates use for the fields of [`PodContext`]: the four strings, then the two maps, then the
/// containers. A field's index is its bit in [`Reads`] and in a render's record of reads.
pub(crate) const POD_FIELDS: [&str; 7] =
    ["name", "generateName", "namespace", "serviceAccountName", "labels", "annotations", "containers"];

/// The indexes of the maps and the containers in [`POD_FIELDS`]; the four before them are strings.
const LABELS: usize = 4;
const ANNOTATIONS: usize = 5;
const CONTAINERS: usize = 6;

/// Which fields of the pod a renderer's leaves may read, one bit per [`POD_FIELDS`] entry, as told by the
/// variables its expressions name: which parts of the pod the engine hands it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Reads(u8);

impl Reads {
    const LABELS: u8 = 1 << LABELS;
    const ANNOTATIONS: u8 = 1 << ANNOTATIONS;
    const CONTAINERS: u8 = 1 << CONTAINERS;

    /// The fields a leaf reads through the variable `var` (`pod.labels.app`, `pod`), as minijinja names it.
    pub(crate) fn of(var: &str) -> Reads {
        if var == "pod" {
            // The whole pod (printed, iterated, or read by subscript, which is not tracked by name).
            return Reads(u8::MAX);
        }
        let Some(rest) = var.strip_prefix("pod.") else { return Reads(0) };
        let field = rest.split('.').next().unwrap_or(rest);
        // A name that is not a field (a method, say) may read anything: hand over everything.
        Reads(POD_FIELDS.iter().position(|f| *f == field).map_or(u8::MAX, |i| 1 << i))
    }

    pub(crate) fn union(self, other: Reads) -> Reads {
        Reads(self.0 | other.0)
    }

    pub(crate) fn labels(self) -> bool {
        self.0 & Self::LABELS != 0
    }

    pub(crate) fn annotations(self) -> bool {
        self.0 & Self::ANNOTATIONS != 0
    }

    pub(crate) fn containers(self) -> bool {
        self.0 & Self::CONTAINERS != 0
    }
}

impl<M: StrEntries, C: ContainerEntries> PodContext<'_, M, C> {
    fn scalars(&self) -> [&str; 4] {
        [self.name, self.generate_name, self.namespace, self.service_account_name]
    }

    fn map(&self, which: MapId) -> &M {
        match which {
            MapId::Labels => &self.labels,
            MapId::Annotations => &self.annotations,
        }
    }

    /// The context as minijinja sees it: one owned copy of its strings, read on demand, each read noted; of the
    /// maps and the containers, only those in `reads` (the others empty: a renderer never reads them).
    /// `containers` is the pod's containers as [`encode_containers`] writes them, when `reads` has them.
    pub(crate) fn to_object(&self, reads: Reads, containers: Option<&[u8]>) -> Arc<PodObject> {
        let mut text = String::with_capacity(self.scalars().iter().map(|s| s.len()).sum());
        let mut copy = |part: &str| {
            let start = text.len();
            text.push_str(part);
            start..text.len()
        };
        let fields = self.scalars().map(&mut copy);
        let map = |read: bool, m: &M| read.then(|| Arc::new(StrMapObject::new(m)));
        Arc::new(PodObject {
            text,
            fields,
            labels: map(reads.labels(), &self.labels),
            annotations: map(reads.annotations(), &self.annotations),
            containers: match containers.filter(|_| reads.containers()).and_then(ContainersObject::new) {
                Some(list) => Value::from_object(list),
                None => Value::from(()),
            },
            read: AtomicU8::new(0),
        })
    }
}

/// `pod.containers`: a list of `{name, ports}`, from the containers as [`encode_containers`] wrote them for the
/// render cache (one walk over the pod's containers on the tape serves both), made a minijinja value one container
/// at a time, as a render reads it: the default-container annotation reads `pod.containers[0].name`, and a pod of
/// 250 containers paid for 250 maps built and dropped.
#[derive(Debug)]
struct ContainersObject {
    encoded: Vec<u8>,
    /// Where each container starts in `encoded`.
    starts: Vec<usize>,
}

impl ContainersObject {
    /// `None` only for bytes [`encode_containers`] did not write.
    fn new(encoded: &[u8]) -> Option<Self> {
        let mut starts = Vec::new();
        let mut records = Records(encoded);
        while !records.end() {
            starts.push(encoded.len() - records.0.len());
            // Stepped over: the strings are not read, so not checked as UTF-8 (250 containers paid 2% for it).
            read_container(&mut records, |_| Some(""), |_| {})?;
        }
        Some(ContainersObject { encoded: encoded.to_vec(), starts })
    }
}

/// Reads one container as [`encode_containers`] wrote it: its name, each of its ports handed to `port`; `text`
/// makes each string's bytes a `&str`.
fn read_container<'a>(
    records: &mut Records<'a>,
    text: impl Fn(&'a [u8]) -> Option<&'a str>,
    mut port: impl FnMut(Port<'a>),
) -> Option<&'a str> {
    let name = text(records.bytes()?)?;
    while !records.end() {
        let port_name = match records.byte()? {
            1 => Some(text(records.bytes()?)?),
            _ => None,
        };
        let container_port = i64::from_le_bytes(records.take(8)?.try_into().ok()?);
        port(Port { name: port_name, container_port, protocol: text(records.bytes()?)? });
    }
    Some(name)
}

impl Object for ContainersObject {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        #[derive(serde::Serialize)]
        struct Container<'a> {
            name: &'a str,
            ports: Vec<Port<'a>>,
        }
        let start = *self.starts.get(key.as_usize()?)?;
        let mut ports = Vec::new();
        let records = &mut Records(self.encoded.get(start..)?);
        let name = read_container(records, |bytes| std::str::from_utf8(bytes).ok(), |port| ports.push(port))?;
        Some(Value::from(Serde(Container { name, ports })))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.starts.len())
    }
}

/// [`PodContext`] as a minijinja map: `text` holds the four strings at `fields` (in [`POD_FIELDS`] order).
/// A map that is `None` was not handed over (the renderer never reads it) and reads as empty.
#[derive(Debug)]
pub(crate) struct PodObject {
    text: String,
    fields: [Range<usize>; 4],
    labels: Option<Arc<StrMapObject>>,
    annotations: Option<Arc<StrMapObject>>,
    containers: Value,
    /// The fields read, one bit per [`POD_FIELDS`] index (the maps note their own reads).
    read: AtomicU8,
}

impl Object for PodObject {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let index = POD_FIELDS.iter().position(|field| Some(*field) == key.as_str())?;
        let map = |map: &Option<Arc<StrMapObject>>| match map {
            Some(map) => Value::from_dyn_object(map.clone()),
            None => Value::from_object(StrMapObject::new(&std::collections::BTreeMap::new())),
        };
        Some(match index {
            LABELS => map(&self.labels),
            ANNOTATIONS => map(&self.annotations),
            CONTAINERS => {
                self.read.fetch_or(1 << index, Ordering::Relaxed);
                self.containers.clone()
            }
            scalar => {
                self.read.fetch_or(1 << index, Ordering::Relaxed);
                Value::from(&self.text[self.fields[scalar].clone()])
            }
        })
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&POD_FIELDS)
    }
}

/// How many absent keys of one map a render may look up before its record keeps the whole map instead.
const ABSENT_SLOTS: usize = 4;

/// A pod's labels or annotations as a minijinja map, in the pod's order; a key is looked up by a linear scan,
/// which for the handful of entries a pod has is faster than building a hash map. Notes which entries a render
/// read, which absent keys it looked up (by hash) and whether it saw the whole map.
#[derive(Debug)]
pub(crate) struct StrMapObject {
    text: String,
    entries: Vec<(Range<usize>, Range<usize>)>,
    /// Bit `i`: entry `i` was read (entries past 64 count as the whole map).
    read_entries: AtomicU64,
    /// Hashes of the absent keys looked up, the first [`ABSENT_SLOTS`]; `absent_len` may run past them.
    absent: [AtomicU64; ABSENT_SLOTS],
    absent_len: AtomicUsize,
    /// Iterated, printed, measured, or read beyond what the bits and slots hold.
    whole: AtomicBool,
}

impl StrMapObject {
    fn new(map: &impl StrEntries) -> Self {
        let size = map.entries().map(|(k, v)| k.len() + v.len()).sum();
        let mut object = StrMapObject {
            text: String::with_capacity(size),
            entries: Vec::new(),
            read_entries: AtomicU64::new(0),
            absent: Default::default(),
            absent_len: AtomicUsize::new(0),
            whole: AtomicBool::new(false),
        };
        for (key, value) in map.entries() {
            let start = object.text.len();
            object.text.push_str(key);
            let middle = object.text.len();
            object.text.push_str(value);
            object.entries.push((start..middle, middle..object.text.len()));
        }
        object
    }

    fn entry(&self, index: usize) -> (&str, &str) {
        let (key, value) = &self.entries[index];
        (&self.text[key.clone()], &self.text[value.clone()])
    }

    fn saw_whole(&self) -> bool {
        self.whole.load(Ordering::Relaxed) || self.absent_len.load(Ordering::Relaxed) > ABSENT_SLOTS
    }
}

impl Object for StrMapObject {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        // A key that is not a string is in no pod's map: the answer does not depend on the pod.
        let key = key.as_str()?;
        let Some(index) = self.entries.iter().position(|(k, _)| &self.text[k.clone()] == key) else {
            let slot = self.absent_len.fetch_add(1, Ordering::Relaxed);
            if let Some(hash) = self.absent.get(slot) {
                // A pod with another key of the same hash is taken to have this one: a needless miss, never a
                // wrong hit.
                hash.store(hash_bytes(key.as_bytes()), Ordering::Relaxed);
            }
            return None;
        };
        if index < 64 {
            self.read_entries.fetch_or(1 << index, Ordering::Relaxed);
        } else {
            self.whole.store(true, Ordering::Relaxed);
        }
        Some(Value::from(self.entry(index).1))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.whole.store(true, Ordering::Relaxed);
        Enumerator::Values(self.entries.iter().map(|(k, _)| Value::from(&self.text[k.clone()])).collect())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        self.whole.store(true, Ordering::Relaxed);
        Some(self.entries.len())
    }
}

/// The two maps of a pod, as a record names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MapId {
    Labels,
    Annotations,
}

impl MapId {
    const ALL: [MapId; 2] = [MapId::Labels, MapId::Annotations];

    fn of(byte: u8) -> Option<MapId> {
        MapId::ALL.get(usize::from(byte)).copied()
    }
}

/// The kinds of record in [`Dependencies`], each followed by its operands.
mod record {
    /// Field index (one byte), its value.
    pub const FIELD: u8 = 0;
    /// Map (one byte), key, value.
    pub const ENTRY: u8 = 1;
    /// Map (one byte), the key's hash (8 bytes).
    pub const ABSENT: u8 = 2;
    /// Map (one byte), every key and value in order, then the end mark.
    pub const WHOLE_MAP: u8 = 3;
    /// Every container's name and ports, in order, then the end mark.
    pub const CONTAINERS: u8 = 4;
}

/// What a render read of its pod and the answers it got, as bytes (a sequence of [`record`]s): a cached render
/// answers a pod that gives the same answers. Kept with two hashes: `shape`, of the questions alone (which fields,
/// which keys), and `fingerprint`, of the whole record. A lookup writes a pod's answers to one shape's questions
/// once ([`Dependencies::answers_of`]) and compares them with every entry of that shape by fingerprint, and by
/// bytes only when the fingerprints agree: most entries of a renderer share a shape, so a miss costs one walk of
/// the pod, not one per entry.
#[derive(Debug, Default)]
pub(crate) struct Dependencies {
    record: Vec<u8>,
    shape: u64,
    fingerprint: u64,
}

impl Clone for Dependencies {
    fn clone(&self) -> Self {
        Dependencies { record: self.record.clone(), shape: self.shape, fingerprint: self.fingerprint }
    }

    /// Reuses this one's allocation (a cache entry overwritten in place).
    fn clone_from(&mut self, source: &Self) {
        self.record.clone_from(&source.record);
        self.shape = source.shape;
        self.fingerprint = source.fingerprint;
    }
}

impl Dependencies {
    /// Size of the record in bytes.
    pub(crate) fn len(&self) -> usize {
        self.record.len()
    }

    /// The hash of the questions alone: records of one shape ask the same things of a pod.
    pub(crate) fn shape(&self) -> u64 {
        self.shape
    }

    /// Nothing read: what a render that evaluated nothing depends on.
    pub(crate) fn clear(&mut self) {
        self.record.clear();
        self.seal();
    }

    /// Replaces the record with what `object` (made from `pod` by [`PodContext::to_object`]) was read of;
    /// `containers` is the pod's containers as [`encode_containers`] writes them.
    pub(crate) fn record<M: StrEntries, C: ContainerEntries>(
        &mut self,
        object: &PodObject,
        pod: &PodContext<'_, M, C>,
        containers: &[u8],
    ) {
        let out = &mut self.record;
        out.clear();
        let read = object.read.load(Ordering::Relaxed);
        for (index, value) in pod.scalars().into_iter().enumerate() {
            if read & (1 << index) != 0 {
                out.extend_from_slice(&[record::FIELD, index as u8]);
                put_str(out, value);
            }
        }
        for (id, map) in MapId::ALL.into_iter().zip([&object.labels, &object.annotations]) {
            let Some(map) = map else { continue };
            if map.saw_whole() {
                out.extend_from_slice(&[record::WHOLE_MAP, id as u8]);
                encode_map(pod.map(id), out);
                continue;
            }
            let read = map.read_entries.load(Ordering::Relaxed);
            for index in (0..map.entries.len().min(64)).filter(|i| read & (1 << i) != 0) {
                let (key, value) = map.entry(index);
                out.extend_from_slice(&[record::ENTRY, id as u8]);
                put_str(out, key);
                put_str(out, value);
            }
            let absent = map.absent_len.load(Ordering::Relaxed);
            for hash in &map.absent[..absent] {
                out.extend_from_slice(&[record::ABSENT, id as u8]);
                out.extend_from_slice(&hash.load(Ordering::Relaxed).to_le_bytes());
            }
        }
        if read & (1 << CONTAINERS) != 0 {
            out.push(record::CONTAINERS);
            put_bytes(out, containers);
        }
        self.seal();
    }

    /// Computes the two hashes of the record as written.
    fn seal(&mut self) {
        let mut shape = std::hash::DefaultHasher::new();
        let mut records = Records(&self.record);
        // A record this module wrote always reads back; a short one would only make a shape no pod matches.
        while let Some(kind) = records.byte() {
            shape.write_u8(kind);
            match kind {
                record::FIELD => {
                    shape.write_u8(records.byte().unwrap_or(u8::MAX));
                    records.bytes();
                }
                record::ENTRY => {
                    shape.write_u8(records.byte().unwrap_or(u8::MAX));
                    shape.write(records.bytes().unwrap_or_default());
                    records.bytes();
                }
                record::ABSENT => {
                    shape.write_u8(records.byte().unwrap_or(u8::MAX));
                    shape.write_u64(records.u64().unwrap_or_default());
                }
                record::WHOLE_MAP => {
                    shape.write_u8(records.byte().unwrap_or(u8::MAX));
                    records.skip_map();
                }
                _ => {
                    records.bytes();
                }
            }
        }
        self.shape = shape.finish();
        self.fingerprint = hash_bytes(&self.record);
    }

    /// Writes `pod`'s answers to this record's questions to `answers` (cleared first), exactly as [`record`] would
    /// have written them: a record of the same shape holds for the pod if and only if its bytes equal these.
    /// Returns their fingerprint, or `None` when the pod cannot answer alike (a key looked up is absent, or a key
    /// found absent is present): no record of this shape holds for it.
    ///
    /// [`record`]: Dependencies::record
    pub(crate) fn answers_of<M: StrEntries, C: ContainerEntries>(
        &self,
        pod: &PodContext<'_, M, C>,
        containers: &[u8],
        answers: &mut Vec<u8>,
    ) -> Option<u64> {
        answers.clear();
        let mut records = Records(&self.record);
        while let Some(kind) = records.byte() {
            answers.push(kind);
            match kind {
                record::FIELD => {
                    let index = records.byte()?;
                    records.bytes()?;
                    answers.push(index);
                    put_str(answers, pod.scalars().get(usize::from(index))?);
                }
                record::ENTRY => {
                    let id = records.byte()?;
                    let key = records.bytes()?;
                    records.bytes()?;
                    let (_, value) = pod.map(MapId::of(id)?).entries().find(|(k, _)| k.as_bytes() == key)?;
                    answers.push(id);
                    put_bytes(answers, key);
                    put_str(answers, value);
                }
                record::ABSENT => {
                    let id = records.byte()?;
                    let hash = records.u64()?;
                    if pod.map(MapId::of(id)?).entries().any(|(key, _)| hash_bytes(key.as_bytes()) == hash) {
                        return None;
                    }
                    answers.push(id);
                    answers.extend_from_slice(&hash.to_le_bytes());
                }
                record::WHOLE_MAP => {
                    let id = records.byte()?;
                    records.skip_map()?;
                    answers.push(id);
                    encode_map(pod.map(MapId::of(id)?), answers);
                }
                record::CONTAINERS => {
                    records.bytes()?;
                    put_bytes(answers, containers);
                }
                _ => return None,
            }
        }
        Some(hash_bytes(answers))
    }

    /// Do `answers`, with their `fingerprint` (from [`Dependencies::answers_of`] on a record of this shape), equal
    /// this record's?
    pub(crate) fn holds_for(&self, answers: &[u8], fingerprint: u64) -> bool {
        self.fingerprint == fingerprint && self.record == answers
    }
}

/// A reader of the records: each method takes one operand, `None` past the end.
struct Records<'a>(&'a [u8]);

impl<'a> Records<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            self.0 = &[];
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    /// The end of a map or a list ([`put_end`]), taken if it is next.
    fn end(&mut self) -> bool {
        let end = self.0.starts_with(&u64::MAX.to_le_bytes());
        if end {
            self.0 = &self.0[8..];
        }
        end
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64::from_le_bytes(b.try_into().expect("took 8 bytes")))
    }

    /// Bytes preceded by their length ([`put_bytes`]).
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.u64()?).ok()?;
        self.take(len)
    }

    /// A map as [`encode_map`] writes it.
    fn skip_map(&mut self) -> Option<()> {
        loop {
            let len = self.u64()?;
            if len == u64::MAX {
                return Some(());
            }
            self.take(usize::try_from(len).ok()?)?;
            self.bytes()?;
        }
    }
}

/// The hash of absent keys and of records, the same in every thread of the process. foldhash, not SipHash (a pod
/// of 250 containers hashed them for 1.6% of its call): a collision costs a render, never a wrong answer, since a
/// record holds only if its bytes are equal ([`Dependencies::holds_for`]) and a key whose hash matches an absent
/// one's makes the record not hold.
fn hash_bytes(bytes: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one(bytes)
}

/// A string, preceded by its length.
fn put_str(out: &mut Vec<u8>, text: &str) {
    put_bytes(out, text.as_bytes());
}

/// Bytes, preceded by their length.
fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// The end of a map or a list: a length no string has.
fn put_end(out: &mut Vec<u8>) {
    out.extend_from_slice(&u64::MAX.to_le_bytes());
}

fn encode_map(map: &impl StrEntries, out: &mut Vec<u8>) {
    for (key, value) in map.entries() {
        put_str(out, key);
        put_str(out, value);
    }
    put_end(out);
}

/// The pod's containers as a render that read them depends on: written once per request by the cache (walking
/// them on the tape costs more than comparing the bytes).
pub(crate) fn encode_containers(containers: &impl ContainerEntries, out: &mut Vec<u8>) {
    for (name, ports) in containers.entries() {
        put_str(out, name);
        for port in ports {
            // A port without a name and one named "" read differently (`name` is absent from the first).
            match port.name {
                Some(name) => {
                    out.push(1);
                    put_str(out, name);
                }
                None => out.push(0),
            }
            // The number's bits: only compared.
            out.extend_from_slice(&port.container_port.to_le_bytes());
            put_str(out, port.protocol);
        }
        put_end(out);
    }
    put_end(out);
}

/// The pod under review as templates see it, over the tape.
impl<'t, 'i> PodView<'t, 'i> {
    /// With only the maps and lists that templates `reads` (the others empty, so they cost nothing to hand over).
    pub(crate) fn context(&self, reads: Reads) -> PodContext<'i, StrMap<'t, 'i>, Containers<'t, 'i>> {
        PodContext {
            name: self.name(),
            generate_name: self.generate_name(),
            namespace: self.namespace(),
            service_account_name: self.service_account_name(),
            labels: StrMap(self.labels().filter(|_| reads.labels())),
            annotations: StrMap(self.annotations().filter(|_| reads.annotations())),
            containers: Containers(self.container_list_values()[0].filter(|_| reads.containers())),
        }
    }
}

/// A string-to-string map on the tape (an object, or none), as templates see it. Non-string values are left out.
pub(crate) struct StrMap<'t, 'i>(Option<TapeValue<'t, 'i>>);

impl StrEntries for StrMap<'_, '_> {
    fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        crate::pod::string_entries(self.0)
    }
}

/// The pod's `spec.containers` on the tape (or none), as templates see them.
pub(crate) struct Containers<'t, 'i>(Option<TapeValue<'t, 'i>>);

impl ContainerEntries for Containers<'_, '_> {
    fn entries(&self) -> impl Iterator<Item = (&str, impl Iterator<Item = Port<'_>>)> {
        let containers = self.0.and_then(|list| list.as_array());
        containers.into_iter().flat_map(|list| list.iter()).map(|container| {
            // One pass over the container's fields for both (each `get` is a pass: a pod of 250 containers paid
            // for two).
            let (mut name, mut ports) = (None, None);
            for (key, value) in container.as_object().iter().flat_map(|o| o.iter()) {
                match key {
                    "name" => name = value.into_string(),
                    "ports" => ports = value.as_array(),
                    _ => {}
                }
            }
            let name = name.unwrap_or("");
            let ports = ports.into_iter().flat_map(|list| list.iter()).filter_map(|port| {
                let text = |key: &str| port.get(key).and_then(|v| v.into_string());
                Some(Port {
                    name: text("name"),
                    container_port: port.get("containerPort")?.as_i64()?,
                    // The API server's default, which it has applied before a webhook sees the pod.
                    protocol: text("protocol").unwrap_or("TCP"),
                })
            });
            (name, ports)
        })
    }
}
