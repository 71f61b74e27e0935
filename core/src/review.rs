//! Bytes to review: a borrowed, zero-copy view of an `AdmissionReview` over a simd-json tape.
//!
//! simd-json parses the request body in place (strings are unescaped inside the buffer) into a tape that the
//! caller reuses across requests. Nothing here copies a string: every `&str` points into the request buffer.
//! Only the envelope fields the decision needs are read; the rest of the document (`managedFields`, `status`,
//! `userInfo`, unknown fields) is stepped over by the tape's subtree counts without being looked at.

mod duplicate_keys;

// The traits by name, not the prelude's glob: its `ArrayTrait` turns every `Vec::iter` into a boxed iterator.
use simd_json::prelude::{TypedScalarValue, ValueAsScalar, ValueIntoString};
use simd_json::tape::{Node, Value};

/// The maximum nesting depth accepted in a request body. A Pod is about 10 levels deep and its `managedFields`
/// add a few more; anything near this limit is not a Pod the API server sent.
pub const MAX_DEPTH: usize = 256;

/// Why a request body could not be read as an `AdmissionReview`. Each message names what is wrong in one line,
/// fit to be sent back to the caller as a 400 reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReviewError {
    /// The body is empty.
    #[error("request body is empty")]
    Empty,
    /// The body is not one well-formed JSON document (includes invalid UTF-8, truncation, trailing data and
    /// nesting deeper than [`MAX_DEPTH`]).
    #[error("request body is not valid JSON: {detail}")]
    Json {
        /// simd-json's description, with the byte offset.
        detail: String,
    },
    /// An object of the document has the same key twice. JSON readers disagree on which one counts (we would
    /// read one pod and the API server store another), so the document has no one reading and is refused.
    #[error(
        "request body has the key {key:?} twice in one object (the second at byte {at}): readers disagree on which one counts"
    )]
    DuplicateKey {
        /// The key, cut to a length fit for a message.
        key: String,
        /// The byte offset of its second occurrence in the body.
        at: usize,
    },
    /// The document is JSON but not an `AdmissionReview` object.
    #[error("request body is not an AdmissionReview: {0}")]
    NotAdmissionReview(&'static str),
    /// `apiVersion` names a version of the admission API we do not speak.
    #[error("unsupported AdmissionReview apiVersion {0:?} (expected admission.k8s.io/v1 or admission.k8s.io/v1beta1)")]
    UnsupportedVersion(String),
    /// A field the protocol requires is missing or has the wrong type.
    #[error("AdmissionReview field {field} is {problem}")]
    BadField {
        /// The JSON path of the field, e.g. `request.uid`.
        field: &'static str,
        /// "missing", "not a string", ...
        problem: &'static str,
    },
    /// A value of the pod that answers may echo is longer than the API server lets any pod have (it would refuse
    /// the pod after the mutating webhooks): refused before the pod is looked at further.
    #[error("the pod's {field} is longer than the API server allows ({limit} bytes); it would refuse the pod")]
    BeyondApiLimit {
        /// The field, e.g. `metadata.name`.
        field: &'static str,
        /// The API's limit, in bytes.
        limit: usize,
    },
}

impl ReviewError {
    /// The parse error `err` of `body` (the request as received), with the byte it happened at.
    pub(crate) fn json(err: &simd_json::Error, body: &[u8]) -> Self {
        let detail = match err.error() {
            // simd-json validates UTF-8 a block at a time and reports no position: find it.
            simd_json::ErrorType::InvalidUtf8 => {
                let at = std::str::from_utf8(body).err().map_or(err.index(), |e| e.valid_up_to());
                format!("invalid UTF-8 at byte {at}")
            }
            simd_json::ErrorType::Eof => format!("unexpected end of input at byte {} (truncated body?)", body.len()),
            simd_json::ErrorType::TrailingData => format!("trailing data after the document at byte {}", err.index()),
            simd_json::ErrorType::DepthLimitExceeded => {
                format!("nesting deeper than {MAX_DEPTH} levels at byte {}", err.index())
            }
            _ => err.to_string().replace(" at character ", " at byte "),
        };
        ReviewError::Json { detail }
    }

    fn duplicate_key(key: &str, body_start: usize) -> Self {
        // `key` points into the body, where simd-json unescaped it in place: at the original key's first byte.
        let at = (key.as_ptr() as usize).saturating_sub(body_start);
        let mut end = key.len().min(MAX_KEY_IN_MESSAGE);
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        ReviewError::DuplicateKey { key: key[..end].to_owned(), at }
    }
}

/// Refuses a document in which an object has the same key twice, anywhere (see [`duplicate_keys`]).
/// `body_start` is the address of the body the tape points into, for the position.
pub(crate) fn refuse_duplicate_keys(nodes: &[Node<'_>], body_start: usize) -> Result<(), ReviewError> {
    match duplicate_keys::find(nodes) {
        Some(key) => Err(ReviewError::duplicate_key(key, body_start)),
        None => Ok(()),
    }
}

/// The longest key quoted in a message.
const MAX_KEY_IN_MESSAGE: usize = 64;

/// The admission API version of a review; the response is written in the same version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiVersion {
    /// `admission.k8s.io/v1`
    V1,
    /// `admission.k8s.io/v1beta1`
    V1Beta1,
}

impl ApiVersion {
    /// The `apiVersion` string.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1 => "admission.k8s.io/v1",
            ApiVersion::V1Beta1 => "admission.k8s.io/v1beta1",
        }
    }
}

/// The group/version/kind of the object under review (`request.kind`).
#[derive(Debug, Clone, Copy)]
pub struct GroupVersionKind<'i> {
    /// API group; empty for the core group.
    pub group: &'i str,
    /// API version, e.g. `v1`.
    pub version: &'i str,
    /// Kind, e.g. `Pod`.
    pub kind: &'i str,
}

/// The parts of `request` the engine reads. Borrowed from the tape (`'t`) and the request buffer (`'i`).
#[derive(Debug, Clone, Copy)]
pub struct Review<'t, 'i> {
    /// The version the review arrived in.
    pub version: ApiVersion,
    /// `request.uid`, echoed in the response.
    pub uid: &'i str,
    /// `request.kind`.
    pub kind: GroupVersionKind<'i>,
    /// `request.operation`: CREATE, UPDATE, DELETE or CONNECT.
    pub operation: &'i str,
    /// `request.subResource`, empty when absent.
    pub sub_resource: &'i str,
    /// `request.namespace`, empty when absent.
    pub namespace: &'i str,
    /// `request.object`, `None` when absent or null.
    pub object: Option<Value<'t, 'i>>,
    /// `request.oldObject` (an UPDATE's object as it was), `None` when absent or null.
    pub old_object: Option<Value<'t, 'i>>,
    /// `request.dryRun`.
    pub dry_run: bool,
}

/// Reads the review envelope from a parsed document. Each object is walked once, picking out the fields it needs
/// (a `get` per field would rescan the keys each time); with a duplicated key, the last one wins, as in Go.
pub(crate) fn read<'t, 'i>(root: Value<'t, 'i>) -> Result<Review<'t, 'i>, ReviewError> {
    let Some(top) = root.as_object() else {
        return Err(ReviewError::NotAdmissionReview("the document is not a JSON object"));
    };
    let (mut kind, mut api_version, mut request) = (None, None, None);
    for (key, value) in top.iter() {
        match key {
            "kind" => kind = Some(value),
            "apiVersion" => api_version = Some(value),
            "request" => request = Some(value),
            _ => {}
        }
    }
    match kind.map(|k| k.into_string()) {
        Some(Some("AdmissionReview")) => {}
        Some(_) => return Err(ReviewError::NotAdmissionReview("kind is not AdmissionReview")),
        None => return Err(ReviewError::NotAdmissionReview("kind is missing")),
    }
    let version = match api_version.map(|v| v.into_string()) {
        Some(Some("admission.k8s.io/v1")) => ApiVersion::V1,
        Some(Some("admission.k8s.io/v1beta1")) => ApiVersion::V1Beta1,
        Some(Some(other)) => return Err(ReviewError::UnsupportedVersion(other.to_owned())),
        Some(None) => return Err(bad("apiVersion", "not a string")),
        None => return Err(bad("apiVersion", "missing")),
    };
    let request = match request {
        Some(r) if r.is_null() => return Err(bad("request", "null")),
        Some(r) => r.as_object().ok_or_else(|| bad("request", "not an object"))?,
        None => return Err(bad("request", "missing")),
    };
    let mut fields = RequestFields::default();
    for (key, value) in request.iter() {
        match key {
            "uid" => fields.uid = Some(value),
            "kind" => fields.kind = Some(value),
            "operation" => fields.operation = Some(value),
            "subResource" => fields.sub_resource = Some(value),
            "namespace" => fields.namespace = Some(value),
            "object" => fields.object = Some(value),
            "oldObject" => fields.old_object = Some(value),
            "dryRun" => fields.dry_run = Some(value),
            _ => {}
        }
    }
    let uid = required_str(fields.uid, "request.uid")?;
    if uid.is_empty() {
        return Err(bad("request.uid", "empty"));
    }
    if uid.len() > MAX_UID_BYTES {
        // The answer echoes it: a client could otherwise make an answer as large as its request.
        return Err(bad("request.uid", "longer than the API server's UIDs (36 characters)"));
    }
    let kind = match fields.kind {
        Some(k) if k.as_object().is_some() => GroupVersionKind {
            group: optional_str(k.get("group"), "request.kind.group")?,
            version: required_str(k.get("version"), "request.kind.version")?,
            kind: required_str(k.get("kind"), "request.kind.kind")?,
        },
        Some(_) => return Err(bad("request.kind", "not an object")),
        None => return Err(bad("request.kind", "missing")),
    };
    let dry_run = match fields.dry_run {
        None => false,
        Some(v) if v.is_null() => false,
        Some(v) => v.as_bool().ok_or_else(|| bad("request.dryRun", "not a boolean"))?,
    };
    Ok(Review {
        version,
        uid,
        kind,
        operation: required_str(fields.operation, "request.operation")?,
        sub_resource: optional_str(fields.sub_resource, "request.subResource")?,
        namespace: optional_str(fields.namespace, "request.namespace")?,
        object: fields.object.filter(|o| !o.is_null()),
        old_object: fields.old_object.filter(|o| !o.is_null()),
        dry_run,
    })
}

/// The longest `request.uid` accepted: the API server's are UUIDs, 36 characters.
pub const MAX_UID_BYTES: usize = 36;

/// The members of `request` the engine reads, as found in one walk over it.
#[derive(Default)]
struct RequestFields<'t, 'i> {
    uid: Option<Value<'t, 'i>>,
    kind: Option<Value<'t, 'i>>,
    operation: Option<Value<'t, 'i>>,
    sub_resource: Option<Value<'t, 'i>>,
    namespace: Option<Value<'t, 'i>>,
    object: Option<Value<'t, 'i>>,
    old_object: Option<Value<'t, 'i>>,
    dry_run: Option<Value<'t, 'i>>,
}

fn bad(field: &'static str, problem: &'static str) -> ReviewError {
    ReviewError::BadField { field, problem }
}

fn required_str<'i>(value: Option<Value<'_, 'i>>, field: &'static str) -> Result<&'i str, ReviewError> {
    match value {
        Some(v) => v.into_string().ok_or_else(|| bad(field, "not a string")),
        None => Err(bad(field, "missing")),
    }
}

/// An optional string field: absent and null both read as "".
fn optional_str<'i>(value: Option<Value<'_, 'i>>, field: &'static str) -> Result<&'i str, ReviewError> {
    match value {
        None => Ok(""),
        Some(v) if v.is_null() => Ok(""),
        Some(v) => v.into_string().ok_or_else(|| bad(field, "not a string")),
    }
}
