//! The API machinery's rules for names and values (`k8s.io/apimachinery/pkg/util/validation`), with the API
//! server's messages. Each returns the messages of the rules a value breaks: empty (no allocation) when it is valid,
//! as these run per request on rendered values.

/// The longest DNS-1123 label (container, volume, port-less names).
pub(crate) const DNS1123_LABEL_MAX_LENGTH: usize = 63;
/// The longest DNS-1123 subdomain (object names).
pub(crate) const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
/// The longest label value, and the longest name part of a qualified name.
pub(crate) const LABEL_VALUE_MAX_LENGTH: usize = 63;
/// The most bytes an object's annotations may hold, keys and values together.
pub(crate) const TOTAL_ANNOTATION_SIZE_LIMIT_B: usize = 256 * 1024;
/// The longest port name (an IANA service name).
const PORT_NAME_MAX_LENGTH: usize = 15;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str =
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const ENV_VAR_NAME_FMT: &str = "[-._a-zA-Z][-._a-zA-Z0-9]*";
const ENV_VAR_NAME_MSG: &str = "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit";
const RELAXED_ENV_VAR_NAME_MSG: &str =
    "a valid environment variable name must consist only of printable ASCII characters other than '='";
const CONFIG_MAP_KEY_FMT: &str = "[-._a-zA-Z0-9]+";
const CONFIG_MAP_KEY_MSG: &str = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'";
const HTTP_HEADER_NAME_FMT: &str = "[-A-Za-z0-9]+";
const HTTP_HEADER_NAME_MSG: &str = "a valid HTTP header must consist of alphanumeric characters or '-'";

/// `IsDNS1123Label`: container, volume and init container names.
pub(crate) fn dns1123_label(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errors.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !is_label(value.as_bytes()) {
        errors.push(regex_error(DNS1123_LABEL_MSG, DNS1123_LABEL_FMT, &["my-name", "123-abc"]));
    }
    errors
}

/// `IsDNS1123Subdomain`: object names, service account names.
pub(crate) fn dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errors.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !is_subdomain(value) {
        errors.push(regex_error(DNS1123_SUBDOMAIN_MSG, DNS1123_SUBDOMAIN_FMT, &["example.com"]));
    }
    errors
}

/// `IsQualifiedName`: label and annotation keys, resource names: a name with an optional DNS subdomain prefix.
pub(crate) fn qualified_name(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let mut parts = value.split('/');
    let (prefix, name) = match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, _) => (None, name),
        (Some(prefix), Some(name), None) => (Some(prefix), name),
        _ => {
            let mut message = String::from("a qualified name ");
            message.push_str(&regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"]));
            message.push_str(" with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')");
            return vec![message];
        }
    };
    match prefix {
        Some("") => errors.push(format!("prefix part {}", empty_error())),
        Some(prefix) => errors.extend(dns1123_subdomain(prefix).into_iter().map(|m| format!("prefix part {m}"))),
        None => {}
    }
    if name.is_empty() {
        errors.push(format!("name part {}", empty_error()));
    } else if name.len() > LABEL_VALUE_MAX_LENGTH {
        errors.push(format!("name part {}", max_len_error(LABEL_VALUE_MAX_LENGTH)));
    }
    if !is_qualified_name_part(name.as_bytes()) {
        let rule = regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"]);
        errors.push(format!("name part {rule}"));
    }
    errors
}

/// `IsValidLabelValue`: empty, or a qualified name's name part of at most 63 characters.
pub(crate) fn label_value(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errors.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !value.is_empty() && !is_qualified_name_part(value.as_bytes()) {
        errors.push(regex_error(LABEL_VALUE_MSG, LABEL_VALUE_FMT, &["MyValue", "my_value", "12345"]));
    }
    errors
}

/// `IsEnvVarName` before Kubernetes 1.32: letters, digits, `_`, `-` and `.`, not starting with a digit.
pub(crate) fn env_var_name(value: &str) -> Vec<String> {
    let bytes = value.as_bytes();
    let char_ok = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_');
    let valid = bytes.first().is_some_and(|b| !b.is_ascii_digit()) && bytes.iter().all(char_ok);
    let mut errors = Vec::new();
    if !valid {
        errors.push(regex_error(ENV_VAR_NAME_MSG, ENV_VAR_NAME_FMT, &["my.env-name", "MY_ENV.NAME", "MyEnvName1"]));
    }
    errors.extend(ch_dir_prefix(value));
    errors
}

/// `IsRelaxedEnvVarName` (RelaxedEnvironmentVariableValidation, on by default from 1.32): printable ASCII but `=`.
pub(crate) fn env_var_name_relaxed(value: &str) -> Vec<String> {
    let valid = value.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'=');
    let mut errors = Vec::new();
    if !valid {
        errors.push(RELAXED_ENV_VAR_NAME_MSG.to_owned());
    }
    errors.extend(ch_dir_prefix(value));
    errors
}

/// `IsConfigMapKey`: a key of a ConfigMap or Secret.
pub(crate) fn config_map_key(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errors.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    let char_ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_');
    if value.is_empty() || !value.bytes().all(char_ok) {
        errors.push(regex_error(CONFIG_MAP_KEY_MSG, CONFIG_MAP_KEY_FMT, &["key.name", "KEY_NAME", "key-name"]));
    }
    errors.extend(ch_dir_prefix(value));
    errors
}

/// `IsValidPortName`: an IANA service name, at most 15 lowercase letters, digits and single inner hyphens, with
/// at least one letter.
pub(crate) fn port_name(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > PORT_NAME_MAX_LENGTH {
        errors.push(max_len_error(PORT_NAME_MAX_LENGTH));
    }
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        errors.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_owned());
    }
    // The API server's check is for a letter, whatever its message says.
    if !value.bytes().any(|b| b.is_ascii_lowercase()) {
        errors.push("must contain at least one letter or number (a-z, 0-9)".to_owned());
    }
    if value.contains("--") {
        errors.push("must not contain consecutive hyphens".to_owned());
    }
    if value.starts_with('-') || value.ends_with('-') {
        errors.push("must not begin or end with a hyphen".to_owned());
    }
    errors
}

/// `IsValidPortNum`: 1 to 65535.
pub(crate) fn port_num(port: i64) -> Vec<String> {
    if (1..=65535).contains(&port) { Vec::new() } else { vec![inclusive_range_error(1, 65535)] }
}

/// `IsHTTPHeaderName`.
pub(crate) fn http_header_name(value: &str) -> Vec<String> {
    let valid = !value.is_empty() && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if valid { Vec::new() } else { vec![regex_error(HTTP_HEADER_NAME_MSG, HTTP_HEADER_NAME_FMT, &["X-Header-Name"])] }
}

/// `InclusiveRangeError`.
pub(crate) fn inclusive_range_error(low: i64, high: i64) -> String {
    format!("must be between {low} and {high}, inclusive")
}

fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

fn empty_error() -> &'static str {
    "must be non-empty"
}

/// `RegexError`: the rule, its examples and the regular expression, worded as the API server words them.
fn regex_error(message: &str, regex: &str, examples: &[&str]) -> String {
    let mut text = message.to_owned();
    if !examples.is_empty() {
        text.push_str(" (e.g. ");
        for (i, example) in examples.iter().enumerate() {
            if i > 0 {
                text.push_str(" or ");
            }
            text.push('\'');
            text.push_str(example);
            text.push_str("', ");
        }
        text.push_str("regex used for validation is '");
    } else {
        text.push_str(" (regex used for validation is '");
    }
    text.push_str(regex);
    text.push_str("')");
    text
}

/// `hasChDirPrefix`: `.`, `..` and names starting with `..` would escape the directory they name a file in.
fn ch_dir_prefix(value: &str) -> Option<String> {
    match value {
        "." => Some("must not be '.'".to_owned()),
        ".." => Some("must not be '..'".to_owned()),
        v if v.starts_with("..") => Some("must not start with '..'".to_owned()),
        _ => None,
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn is_label(bytes: &[u8]) -> bool {
    let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => edge(first) && edge(last) && bytes.iter().all(|b| edge(b) || *b == b'-'),
        _ => false,
    }
}

/// Labels separated by dots.
fn is_subdomain(value: &str) -> bool {
    value.split('.').all(|label| is_label(label.as_bytes()))
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_qualified_name_part(bytes: &[u8]) -> bool {
    let edge = |b: &u8| b.is_ascii_alphanumeric();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            edge(first) && edge(last) && bytes.iter().all(|b| edge(b) || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_and_subdomains() {
        for ok in ["a", "proxy", "proxy-2", "0", "a-b-c", &"a".repeat(63)] {
            assert!(dns1123_label(ok).is_empty(), "{ok}");
        }
        for bad in ["", "A", "-a", "a-", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!dns1123_label(bad).is_empty(), "{bad}");
        }
        assert_eq!(dns1123_label(&"a".repeat(64)), ["must be no more than 63 characters"]);
        assert!(dns1123_subdomain("example.com").is_empty() && dns1123_subdomain("a.b-c.d").is_empty());
        assert_eq!(
            dns1123_subdomain("a..b"),
            [
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        );
    }

    #[test]
    fn qualified_names() {
        for ok in ["app", "app.kubernetes.io/name", "A_b.c-D", "example.com/x", "1"] {
            assert!(qualified_name(ok).is_empty(), "{ok}");
        }
        assert_eq!(qualified_name("/x"), ["prefix part must be non-empty"]);
        assert_eq!(
            qualified_name("x/"),
            [
                "name part must be non-empty",
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
            ]
        );
        assert!(qualified_name("Example.com/x")[0].starts_with("prefix part a lowercase RFC 1123 subdomain"));
        assert!(qualified_name("a/b/c")[0].starts_with("a qualified name must consist"));
        assert!(qualified_name("Bad Key")[0].starts_with("name part must consist of alphanumeric"));
        assert_eq!(qualified_name(&"a".repeat(64))[0], "name part must be no more than 63 characters");
    }

    #[test]
    fn label_values() {
        for ok in ["", "true", "v1.2_3-x", &"a".repeat(63)] {
            assert!(label_value(ok).is_empty(), "{ok}");
        }
        assert_eq!(label_value(&"a".repeat(64)), ["must be no more than 63 characters"]);
        assert_eq!(
            label_value("-edge"),
            [
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
            ]
        );
    }

    #[test]
    fn env_var_names_before_and_after_1_32() {
        for ok in ["POD_IP", "pod.ip-2", "_x", "-x"] {
            assert!(env_var_name(ok).is_empty(), "{ok}");
        }
        assert_eq!(
            env_var_name("1BAD"),
            [
                "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')"
            ]
        );
        assert_eq!(env_var_name("..x"), ["must not start with '..'"]);
        assert!(!env_var_name("").is_empty() && !env_var_name("A B").is_empty());
        assert!(env_var_name_relaxed("1 BAD:x").is_empty());
        assert_eq!(env_var_name_relaxed("A=B"), [RELAXED_ENV_VAR_NAME_MSG]);
        assert!(!env_var_name_relaxed("tab\t").is_empty());
    }

    #[test]
    fn port_names_and_numbers() {
        for ok in ["http", "admin-2", "h2c", "a"] {
            assert!(port_name(ok).is_empty(), "{ok}");
        }
        assert_eq!(port_name("admin_port"), ["must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"]);
        assert_eq!(port_name("1234"), ["must contain at least one letter or number (a-z, 0-9)"]);
        assert_eq!(port_name("a--b"), ["must not contain consecutive hyphens"]);
        assert_eq!(port_name("-a"), ["must not begin or end with a hyphen"]);
        assert_eq!(port_name("a-long-port-name-x"), ["must be no more than 15 characters"]);
        assert!(port_num(1).is_empty() && port_num(65535).is_empty());
        assert_eq!(port_num(65536), ["must be between 1 and 65535, inclusive"]);
        assert!(!port_num(0).is_empty());
    }

    #[test]
    fn keys_identifiers_and_headers() {
        assert!(config_map_key("key.name").is_empty() && config_map_key("KEY_NAME-1").is_empty());
        assert_eq!(config_map_key(".."), ["must not be '..'"]);
        assert!(config_map_key("a/b")[0].starts_with("a valid config key must consist of alphanumeric"));
        assert!(http_header_name("X-Header-Name").is_empty());
        assert_eq!(
            http_header_name("X Header"),
            [
                "a valid HTTP header must consist of alphanumeric characters or '-' (e.g. 'X-Header-Name', regex used for validation is '[-A-Za-z0-9]+')"
            ]
        );
    }
}
