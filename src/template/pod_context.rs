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
    pub(crate) fn to_object(&self, reads: Reads) -> Arc<PodObject> {
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
            containers: if reads.containers() { containers_value(&self.containers) } else { Value::from(()) },
            read: AtomicU8::new(0),
        })
    }
}

/// `pod.containers`: a list of `{name, ports}`.
fn containers_value(containers: &impl ContainerEntries) -> Value {
    #[derive(serde::Serialize)]
    struct Container<'a> {
        name: &'a str,
        ports: Vec<Port<'a>>,
    }
    let list: Vec<Container<'_>> =
        containers.entries().map(|(name, ports)| Container { name, ports: ports.collect() }).collect();
    Value::from(Serde(list))
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
                hash.store(key_hash(key), Ordering::Relaxed);
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

/// The hash an absent key is remembered by. A pod with another key of the same hash is taken to have the key:
/// a needless miss, never a wrong hit.
fn key_hash(key: &str) -> u64 {
    // SipHash with fixed keys: the same in every thread of the process.
    let mut hasher = std::hash::DefaultHasher::new();
    hasher.write(key.as_bytes());
    hasher.finish()
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
/// answers a pod that gives the same answers ([`Dependencies::hold_for`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Dependencies(Vec<u8>);

impl Clone for Dependencies {
    fn clone(&self) -> Self {
        Dependencies(self.0.clone())
    }

    /// Reuses this one's allocation (a cache entry overwritten in place).
    fn clone_from(&mut self, source: &Self) {
        self.0.clone_from(&source.0);
    }
}

impl Dependencies {
    /// Size of the record in bytes.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Nothing read: what a render that evaluated nothing depends on.
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    /// Replaces the record with what `object` (made from `pod` by [`PodContext::to_object`]) was read of;
    /// `containers` is the pod's containers as [`encode_containers`] writes them.
    pub(crate) fn record<M: StrEntries, C: ContainerEntries>(
        &mut self,
        object: &PodObject,
        pod: &PodContext<'_, M, C>,
        containers: &[u8],
    ) {
        let out = &mut self.0;
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
    }

    /// Does `pod` (with its `containers` encoded) give every answer recorded? Allocates nothing.
    pub(crate) fn hold_for<M: StrEntries, C: ContainerEntries>(
        &self,
        pod: &PodContext<'_, M, C>,
        containers: &[u8],
    ) -> bool {
        let mut expect = Expect { rest: &self.0, matches: true };
        while let Some(kind) = expect.byte() {
            match kind {
                record::FIELD => {
                    let Some(value) = expect.byte().and_then(|i| pod.scalars().get(usize::from(i)).copied()) else {
                        return false;
                    };
                    put_str(&mut expect, value);
                }
                record::ENTRY => {
                    let (Some(id), Some(key)) = (expect.map_id(), expect.str()) else { return false };
                    let Some((_, value)) = pod.map(id).entries().find(|(k, _)| *k == key) else { return false };
                    put_str(&mut expect, value);
                }
                record::ABSENT => {
                    let (Some(id), Some(hash)) = (expect.map_id(), expect.u64()) else { return false };
                    if pod.map(id).entries().any(|(key, _)| key_hash(key) == hash) {
                        return false;
                    }
                }
                record::WHOLE_MAP => {
                    let Some(id) = expect.map_id() else { return false };
                    encode_map(pod.map(id), &mut expect);
                }
                record::CONTAINERS => put_bytes(&mut expect, containers),
                _ => return false,
            }
            if !expect.matches {
                return false;
            }
        }
        true
    }
}

/// Where a record's operands are written: a buffer, or [`Expect`], which checks them against a written record.
/// One encoding serves both, so a record is read back exactly as it was written.
pub(crate) trait Sink {
    fn put(&mut self, bytes: &[u8]);

    /// A length or a number: compared as a number, so a string of another length is told apart without
    /// comparing bytes.
    fn put_u64(&mut self, n: u64);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    fn put_u64(&mut self, n: u64) {
        self.extend_from_slice(&n.to_le_bytes());
    }
}

/// The unread rest of the records, which each `put` must match.
struct Expect<'a> {
    rest: &'a [u8],
    /// False from the first `put` that did not match (or ran past the end).
    matches: bool,
}

impl<'a> Expect<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.rest.len() < n {
            self.matches = false;
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }

    /// The next byte; `None` at the end.
    fn byte(&mut self) -> Option<u8> {
        let (first, tail) = self.rest.split_first()?;
        self.rest = tail;
        Some(*first)
    }

    fn map_id(&mut self) -> Option<MapId> {
        self.byte().and_then(MapId::of)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64::from_le_bytes(b.try_into().expect("took 8 bytes")))
    }

    fn str(&mut self) -> Option<&'a str> {
        let len = usize::try_from(self.u64()?).ok()?;
        std::str::from_utf8(self.take(len)?).ok()
    }
}

impl Sink for Expect<'_> {
    fn put(&mut self, bytes: &[u8]) {
        if self.matches && self.take(bytes.len()) != Some(bytes) {
            self.matches = false;
        }
    }

    fn put_u64(&mut self, n: u64) {
        if self.matches && self.u64() != Some(n) {
            self.matches = false;
        }
    }
}

/// A string, preceded by its length.
fn put_str(sink: &mut impl Sink, text: &str) {
    put_bytes(sink, text.as_bytes());
}

/// Bytes, preceded by their length.
fn put_bytes(sink: &mut impl Sink, bytes: &[u8]) {
    sink.put_u64(bytes.len() as u64);
    sink.put(bytes);
}

/// The end of a map or a list: a length no string has.
fn put_end(sink: &mut impl Sink) {
    sink.put_u64(u64::MAX);
}

fn encode_map(map: &impl StrEntries, sink: &mut impl Sink) {
    for (key, value) in map.entries() {
        put_str(sink, key);
        put_str(sink, value);
    }
    put_end(sink);
}

/// The pod's containers as a render that read them depends on: written once per request by the cache (walking
/// them on the tape costs more than comparing the bytes, and every cached render that read them is compared).
pub(crate) fn encode_containers(containers: &impl ContainerEntries, sink: &mut impl Sink) {
    for (name, ports) in containers.entries() {
        put_str(sink, name);
        for port in ports {
            // A port without a name and one named "" read differently (`name` is absent from the first).
            match port.name {
                Some(name) => {
                    sink.put(&[1]);
                    put_str(sink, name);
                }
                None => sink.put(&[0]),
            }
            sink.put_u64(port.container_port as u64);
            put_str(sink, port.protocol);
        }
        put_end(sink);
    }
    put_end(sink);
}
