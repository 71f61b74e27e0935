//! Field errors as the API server reports them (`k8s.io/apimachinery/pkg/util/validation/field`): a path into the
//! object, what kind of problem, the bad value and a detail, printed as `spec.containers[1].name: Invalid value:
//! "Proxy_Sidecar": a lowercase RFC 1123 label must ...`.

use std::borrow::Cow;
use std::fmt;

/// One step of a path into an object: a struct field (`.name`), a map key (`[cpu]`), or a list index (`[1]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// A field of an object, printed `.field`.
    Field(Cow<'static, str>),
    /// A key of a map (resource names, annotation keys), printed `[key]`.
    Key(String),
    /// An index into a list, printed `[i]`.
    Index(usize),
}

impl Seg {
    /// The object key this step reads, for a field or a map key.
    pub fn key(&self) -> Option<&str> {
        match self {
            Seg::Field(field) => Some(field),
            Seg::Key(key) => Some(key),
            Seg::Index(_) => None,
        }
    }
}

/// A path into an object, from its root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldPath(pub Vec<Seg>);

impl FieldPath {
    /// The path of a field of the object at `self`.
    pub(crate) fn child(&self, field: &'static str) -> FieldPath {
        self.with(Seg::Field(Cow::Borrowed(field)))
    }

    /// The path of a field whose name is only known at run time (the API server names some errors after a map
    /// key as if it were a field: `metadata.annotations.seccomp.security.alpha.kubernetes.io/pod`).
    pub(crate) fn field_named(&self, field: &str) -> FieldPath {
        self.with(Seg::Field(Cow::Owned(field.to_owned())))
    }

    /// The path of a key of the map at `self`.
    pub(crate) fn key(&self, key: &str) -> FieldPath {
        self.with(Seg::Key(key.to_owned()))
    }

    /// The path of an item of the list at `self`.
    pub(crate) fn index(&self, index: usize) -> FieldPath {
        self.with(Seg::Index(index))
    }

    fn with(&self, seg: Seg) -> FieldPath {
        let mut segs = Vec::with_capacity(self.0.len() + 1);
        segs.extend_from_slice(&self.0);
        segs.push(seg);
        FieldPath(segs)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Field(field) if i == 0 => f.write_str(field)?,
                Seg::Field(field) => write!(f, ".{field}")?,
                Seg::Key(key) => write!(f, "[{key}]")?,
                Seg::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

/// The value a field error shows, printed as Go prints it: strings quoted, numbers and booleans bare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadValue {
    /// A string, printed quoted.
    Str(String),
    /// An integer.
    Int(i64),
    /// Anything else, printed as given.
    Other(String),
}

impl fmt::Display for BadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadValue::Str(s) => write!(f, "{s:?}"),
            BadValue::Int(n) => write!(f, "{n}"),
            BadValue::Other(text) => f.write_str(text),
        }
    }
}

impl From<&str> for BadValue {
    fn from(value: &str) -> Self {
        BadValue::Str(value.to_owned())
    }
}

impl From<i64> for BadValue {
    fn from(value: i64) -> Self {
        BadValue::Int(value)
    }
}

/// What is wrong with a field (the API server's `ErrorType`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// A reference to something that does not exist (`Not found`).
    NotFound(BadValue),
    /// A required value is missing (`Required value`).
    Required,
    /// A value that must be unique is repeated (`Duplicate value`).
    Duplicate(BadValue),
    /// A malformed or out-of-range value (`Invalid value`).
    Invalid(BadValue),
    /// A value outside an enumeration (`Unsupported value`).
    NotSupported(BadValue),
    /// A value that is well-formed but not allowed here (`Forbidden`).
    Forbidden,
    /// A value too long (`Too long`).
    TooLong,
}

impl ErrorKind {
    fn label(&self) -> &'static str {
        match self {
            ErrorKind::NotFound(_) => "Not found",
            ErrorKind::Required => "Required value",
            ErrorKind::Duplicate(_) => "Duplicate value",
            ErrorKind::Invalid(_) => "Invalid value",
            ErrorKind::NotSupported(_) => "Unsupported value",
            ErrorKind::Forbidden => "Forbidden",
            ErrorKind::TooLong => "Too long",
        }
    }

    fn value(&self) -> Option<&BadValue> {
        match self {
            ErrorKind::NotFound(v) | ErrorKind::Duplicate(v) | ErrorKind::Invalid(v) | ErrorKind::NotSupported(v) => {
                Some(v)
            }
            ErrorKind::Required | ErrorKind::Forbidden | ErrorKind::TooLong => None,
        }
    }
}

/// One problem the API server would report for a pod, in its words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Where.
    pub path: FieldPath,
    /// What kind of problem, with the bad value.
    pub kind: ErrorKind,
    /// Why, or what is expected.
    pub detail: String,
}

impl FieldError {
    pub(crate) fn new(path: &FieldPath, kind: ErrorKind, detail: impl Into<String>) -> Self {
        FieldError { path: path.clone(), kind, detail: detail.into() }
    }

    pub(crate) fn invalid(path: &FieldPath, value: impl Into<BadValue>, detail: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Invalid(value.into()), detail)
    }

    pub(crate) fn required(path: &FieldPath, detail: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Required, detail)
    }

    pub(crate) fn forbidden(path: &FieldPath, detail: impl Into<String>) -> Self {
        Self::new(path, ErrorKind::Forbidden, detail)
    }

    pub(crate) fn duplicate(path: &FieldPath, value: impl Into<BadValue>) -> Self {
        Self::new(path, ErrorKind::Duplicate(value.into()), "")
    }

    pub(crate) fn not_found(path: &FieldPath, value: impl Into<BadValue>) -> Self {
        Self::new(path, ErrorKind::NotFound(value.into()), "")
    }

    /// `supported` are quoted and listed in the detail, as the API server does.
    pub(crate) fn not_supported(path: &FieldPath, value: impl Into<BadValue>, supported: &[&str]) -> Self {
        let quoted: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        let detail = if quoted.is_empty() { String::new() } else { format!("supported values: {}", quoted.join(", ")) };
        Self::new(path, ErrorKind::NotSupported(value.into()), detail)
    }

    /// The message without the path: `Invalid value: "x": why`.
    pub fn body(&self) -> String {
        let mut body = match self.kind.value() {
            Some(value) => format!("{}: {value}", self.kind.label()),
            None => self.kind.label().to_owned(),
        };
        if !self.detail.is_empty() {
            body.push_str(": ");
            body.push_str(&self.detail);
        }
        body
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_as_the_api_server_does() {
        let path = FieldPath::default().child("spec").child("containers").index(1).child("name");
        let error = FieldError::invalid(&path, "Proxy_Sidecar", "a lowercase RFC 1123 label must ...");
        assert_eq!(
            error.to_string(),
            r#"spec.containers[1].name: Invalid value: "Proxy_Sidecar": a lowercase RFC 1123 label must ..."#
        );
        let limits = FieldPath::default().child("resources").child("limits").key("cpu");
        assert_eq!(
            FieldError::invalid(&limits, 99999, "x").to_string(),
            "resources.limits[cpu]: Invalid value: 99999: x"
        );
        assert_eq!(FieldError::required(&limits, "").to_string(), "resources.limits[cpu]: Required value");
        let protocol = FieldPath::default().child("protocol");
        assert_eq!(
            FieldError::not_supported(&protocol, "HTTP", &["SCTP", "TCP", "UDP"]).to_string(),
            r#"protocol: Unsupported value: "HTTP": supported values: "SCTP", "TCP", "UDP""#
        );
        assert_eq!(FieldError::forbidden(&protocol, "no").to_string(), "protocol: Forbidden: no");
    }
}
