//! The API machinery's rules for names and values (`k8s.io/apimachinery/pkg/util/validation`, Kubernetes 1.20),
//! with the API server's own messages, word for word, so that what we report reads as what `kubectl` would show.
//!
//! Each check returns the messages of the rules a value breaks, in the API server's order (its `[]string`): empty
//! when the value is valid. The checks run per request on rendered values (label values among them), so they read
//! bytes instead of running regular expressions, and a valid value costs no allocation (an empty `Vec` allocates
//! nothing); the messages are only built for a value that breaks a rule.

/// The longest DNS-1123 label (container, volume, port-less names).
pub(crate) const DNS1123_LABEL_MAX_LENGTH: usize = 63;
/// The longest DNS-1123 subdomain (object names); also the longest ConfigMap or Secret key.
pub(crate) const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
/// The longest label value, and the longest name part of a qualified name.
pub(crate) const LABEL_VALUE_MAX_LENGTH: usize = 63;
/// The longest qualified name (a label or annotation key): a DNS subdomain prefix, '/', and a name part.
pub(crate) const QUALIFIED_NAME_MAX_LENGTH: usize = DNS1123_SUBDOMAIN_MAX_LENGTH + 1 + LABEL_VALUE_MAX_LENGTH;
/// The most bytes an object's annotations may hold, keys and values together (`TotalAnnotationSizeLimitB`).
pub(crate) const TOTAL_ANNOTATION_SIZE_LIMIT_B: usize = 256 * 1024;
/// The longest port name (an IANA service name, RFC 6335).
const PORT_NAME_MAX_LENGTH: usize = 15;

// Each rule's message and the regular expression the API server names in it (it builds the regular expressions
// from the same fragments: the label's inside the subdomain's, the qualified name's inside the label value's).
const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str =
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_EXAMPLES: &[&str] = &["MyName", "my.name", "123-abc"];
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

/// `IsDNS1123Label`: container, volume and port-less names; the API server's messages for `value`, none if valid.
pub fn dns1123_label(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errors.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !is_dns1123_label(value.as_bytes()) {
        errors.push(regex_error(DNS1123_LABEL_MSG, DNS1123_LABEL_FMT, &["my-name", "123-abc"]));
    }
    errors
}

/// `IsDNS1123Subdomain`: object names, service account names, a qualified name's prefix; the API server's
/// messages for `value`, none if valid.
pub fn dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errors.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !is_dns1123_subdomain(value) {
        errors.push(regex_error(DNS1123_SUBDOMAIN_MSG, DNS1123_SUBDOMAIN_FMT, &["example.com"]));
    }
    errors
}

/// `IsQualifiedName`: label and annotation keys, resource names: a name part with an optional DNS subdomain prefix
/// (`example.com/name`). The prefix and the name part are judged apart, each message saying which part it is about.
pub(crate) fn qualified_name(value: &str) -> Vec<String> {
    let (prefix, name) = match value.split_once('/') {
        None => (None, value),
        Some((prefix, name)) if !name.contains('/') => (Some(prefix), name),
        Some(_) => {
            // More than one '/': the API server says only this.
            let rule = regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, QUALIFIED_NAME_EXAMPLES);
            return vec![format!(
                "a qualified name {rule} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )];
        }
    };
    let mut errors = Vec::new();
    match prefix {
        Some("") => errors.push(format!("prefix part {}", empty_error())),
        Some(prefix) => errors.extend(dns1123_subdomain(prefix).into_iter().map(|m| format!("prefix part {m}"))),
        None => {}
    }
    if name.is_empty() {
        errors.push(format!("name part {}", empty_error()));
    } else if name.len() > LABEL_VALUE_MAX_LENGTH {
        // The API server's `qualifiedNameMaxLength`, also 63.
        errors.push(format!("name part {}", max_len_error(LABEL_VALUE_MAX_LENGTH)));
    }
    if !is_qualified_name_part(name.as_bytes()) {
        let rule = regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, QUALIFIED_NAME_EXAMPLES);
        errors.push(format!("name part {rule}"));
    }
    errors
}

/// `IsValidLabelValue`: empty, or at most 63 letters, digits, `-`, `_` and `.`, alphanumeric at both ends.
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

/// `IsEnvVarName` as Kubernetes 1.20 (and every release without `RelaxedEnvironmentVariableValidation`) checks it:
/// letters, digits, `_`, `-` and `.`, not starting with a digit, and not `.`, `..` or `..`-prefixed.
pub(crate) fn env_var_name(value: &str) -> Vec<String> {
    let bytes = value.as_bytes();
    let valid = bytes.first().is_some_and(|b| !b.is_ascii_digit()) && bytes.iter().all(|&b| is_key_char(b));
    let mut errors = Vec::new();
    if !valid {
        errors.push(regex_error(ENV_VAR_NAME_MSG, ENV_VAR_NAME_FMT, &["my.env-name", "MY_ENV.NAME", "MyEnvName1"]));
    }
    errors.extend(ch_dir_prefix(value));
    errors
}

/// `IsRelaxedEnvVarName`, what the API server checks once `RelaxedEnvironmentVariableValidation` is on (alpha in
/// 1.30, on by default from 1.32, GA in 1.34): non-empty, printable ASCII (space included) but `=`. Unlike the
/// strict rule it has no `.`/`..` check.
pub(crate) fn env_var_name_relaxed(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.is_empty() {
        errors.push(format!("environment variable name {}", empty_error()));
    }
    // Go's `unicode.IsPrint` within ASCII is ' '..='~'; anything beyond ASCII is refused too.
    if value.bytes().any(|b| !(b' '..=b'~').contains(&b) || b == b'=') {
        errors.push(RELAXED_ENV_VAR_NAME_MSG.to_owned());
    }
    errors
}

/// `IsConfigMapKey`: a key of a ConfigMap or Secret (a file name when mounted, hence the `.`/`..` checks).
pub(crate) fn config_map_key(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errors.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if value.is_empty() || !value.bytes().all(is_key_char) {
        errors.push(regex_error(CONFIG_MAP_KEY_MSG, CONFIG_MAP_KEY_FMT, &["key.name", "KEY_NAME", "key-name"]));
    }
    errors.extend(ch_dir_prefix(value));
    errors
}

/// `IsValidPortName`: an IANA service name: at most 15 lowercase letters, digits and single inner hyphens, with at
/// least one letter. Every broken rule has its own message.
pub(crate) fn port_name(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > PORT_NAME_MAX_LENGTH {
        errors.push(max_len_error(PORT_NAME_MAX_LENGTH));
    }
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        errors.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_owned());
    }
    // The API server looks for a letter, whatever its (1.20) message says.
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

/// `IsValidPortNum`: 1 to 65535. Takes an `i64` so that any JSON integer can be judged without a cast.
pub(crate) fn port_num(port: i64) -> Vec<String> {
    if (1..=65535).contains(&port) { Vec::new() } else { vec![inclusive_range_error(1, 65535)] }
}

/// `IsHTTPHeaderName`: letters, digits and `-` (Go's HTTP library's stricter subset of RFC 7230).
pub(crate) fn http_header_name(value: &str) -> Vec<String> {
    let valid = !value.is_empty() && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if valid { Vec::new() } else { vec![regex_error(HTTP_HEADER_NAME_MSG, HTTP_HEADER_NAME_FMT, &["X-Header-Name"])] }
}

/// `InclusiveRangeError`: the message of a number outside `low..=high`, shared with the pod validator's other
/// ranges.
/// `validateLocalDescendingPath`: a relative path without a `..` element (a mount's `subPath`, a seccomp
/// profile's file).
pub(crate) fn relative_path(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.starts_with('/') {
        errors.push("must be a relative path".to_owned());
    }
    if value.split('/').any(|part| part == "..") {
        errors.push("must not contain '..'".to_owned());
    }
    errors
}

/// `ValidateLocalNonReservedPath`: a relative path that neither contains a `..` element nor starts with `..` (a
/// projected file's path).
pub(crate) fn non_reserved_path(value: &str) -> Vec<String> {
    let mut errors = relative_path(value);
    if value.starts_with("..") && !value.starts_with("../") {
        errors.push("must not start with '..'".to_owned());
    }
    errors
}

/// `validateWindowsSecurityContextOptions`'s rules for `runAsUserName` (`DOMAIN\USER`, the domain optional).
pub(crate) fn windows_user_name(value: &str) -> Vec<String> {
    if value.is_empty() {
        return vec!["runAsUserName cannot be an empty string".to_owned()];
    }
    if value.chars().any(|c| c.is_ascii_control()) {
        return vec!["runAsUserName cannot contain control characters".to_owned()];
    }
    let (domain, user) = match value.matches('\\').count() {
        0 => ("", value),
        1 => value.split_once('\\').unwrap_or_default(),
        _ => return vec!["runAsUserName cannot contain more than one backslash".to_owned()],
    };
    let mut errors = Vec::new();
    if domain.len() >= 256 {
        errors.push("runAsUserName's Domain length must be under 256 characters".to_owned());
    }
    if !domain.is_empty() && !netbios_domain(domain) && !dns_domain(domain) {
        errors.push("runAsUserName's Domain doesn't match the NetBios nor the DNS format".to_owned());
    }
    if user.is_empty() {
        errors.push("runAsUserName's User cannot be empty".to_owned());
    } else if user.len() > 104 {
        errors.push("runAsUserName's User length must not be longer than 104 characters".to_owned());
    }
    if !user.is_empty() && user.chars().all(|c| c == '.' || c == ' ') {
        errors.push("runAsUserName's User cannot contain only periods or spaces".to_owned());
    }
    if user.chars().any(|c| "\"/\\:;|=,+*?<>@[]".contains(c)) {
        errors.push("runAsUserName's User cannot contain the following characters: \"/\\:;|=,+*?<>@[]".to_owned());
    }
    errors
}

/// A NetBIOS domain: `^[^\\/:\*\?"<>|\.][^\\/:\*\?"<>|]{0,14}$`.
fn netbios_domain(domain: &str) -> bool {
    let forbidden = |c: char| "\\/:*?\"<>|".contains(c);
    let mut chars = domain.chars();
    chars.next().is_some_and(|first| !forbidden(first) && first != '.')
        && domain.chars().count() <= 15
        && chars.all(|c| !forbidden(c))
}

/// A DNS domain: dot-separated labels of letters, digits and inner dashes, at most 63 characters each.
fn dns_domain(domain: &str) -> bool {
    domain.split('.').all(|label| {
        let bytes = label.as_bytes();
        !bytes.is_empty()
            && bytes.len() <= 63
            && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-')
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
    })
}

pub(crate) fn inclusive_range_error(low: i64, high: i64) -> String {
    format!("must be between {low} and {high}, inclusive")
}

/// `MaxLenError`.
fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

/// `EmptyError`.
fn empty_error() -> &'static str {
    "must be non-empty"
}

/// `RegexError`: the rule, its examples and the regular expression, worded as the API server words them. Each
/// example is followed by `', '`, so that the examples after the first read `,  or '…'` with two spaces: that is
/// the API server's text, kept as it is.
fn regex_error(message: &str, regex: &str, examples: &[&str]) -> String {
    let mut text = String::with_capacity(message.len() + regex.len() + 64);
    text.push_str(message);
    if examples.is_empty() {
        text.push_str(" (regex used for validation is '");
    } else {
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
    }
    text.push_str(regex);
    text.push_str("')");
    text
}

/// `hasChDirPrefix`: `.`, `..` and names starting with `..` would leave the directory they name a file in.
fn ch_dir_prefix(value: &str) -> Option<String> {
    let message = match value {
        "." => "must not be '.'",
        ".." => "must not be '..'",
        _ if value.starts_with("..") => "must not start with '..'",
        _ => return None,
    };
    Some(message.to_owned())
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, the whole value.
fn is_dns1123_label(bytes: &[u8]) -> bool {
    let is_edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => is_edge(first) && is_edge(last) && bytes.iter().all(|b| is_edge(b) || *b == b'-'),
        _ => false,
    }
}

/// Labels joined by single dots: the subdomain's regular expression, `label(\.label)*`.
fn is_dns1123_subdomain(value: &str) -> bool {
    value.split('.').all(|label| is_dns1123_label(label.as_bytes()))
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, the whole value.
fn is_qualified_name_part(bytes: &[u8]) -> bool {
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric() && bytes.iter().all(|&b| is_key_char(b))
        }
        _ => false,
    }
}

/// `[-._a-zA-Z0-9]`: the characters of env var names, ConfigMap keys and qualified names.
fn is_key_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(count: usize) -> String {
        "a".repeat(count)
    }

    #[test]
    fn dns1123_labels() {
        // TestIsDNS1123Label.
        for ok in ["a", "ab", "abc", "a1", "a-1", "a--1--2--b", "0", "01", "012", "1a", "1-a", "1--a--b--2"] {
            assert_eq!(dns1123_label(ok), Vec::<String>::new(), "{ok:?}");
        }
        assert_eq!(dns1123_label(&a(63)), Vec::<String>::new());
        for bad in [
            "", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_", "_a", "a_b", "1_", "_1",
            "1_2", ".", "a.", ".a", "a.b", "1.", ".1", "1.2", " ", "a ", " a", "a b", "1 ", " 1", "1 2", "a\n", "é",
        ] {
            assert!(!dns1123_label(bad).is_empty(), "{bad:?}");
        }
        assert_eq!(
            dns1123_label("Proxy_Sidecar"),
            [
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            ]
        );
        // Too long but well formed: only the length.
        assert_eq!(dns1123_label(&a(64)), ["must be no more than 63 characters"]);
        // Too long and malformed: both, length first.
        let both = dns1123_label(&format!("{}-", a(63)));
        assert_eq!(both.len(), 2);
        assert_eq!(both[0], "must be no more than 63 characters");
    }

    #[test]
    fn dns1123_subdomains() {
        // TestIsDNS1123Subdomain.
        for ok in [
            "a",
            "ab",
            "a--1--2--b",
            "0",
            "1--a--b--2",
            "a.a",
            "a-1.a",
            "a--1--2--b.a",
            "a.1",
            "a--1--2--b.1",
            "0.a",
            "012.a",
            "1-a.a",
            "0.1",
            "1--a--b--2.1",
            "a.b.c.d.e",
            "aa.bb.cc.dd.ee",
            "1.2.3.4.5",
            "11.22.33.44.55",
        ] {
            assert_eq!(dns1123_subdomain(ok), Vec::<String>::new(), "{ok:?}");
        }
        assert_eq!(dns1123_subdomain(&a(253)), Vec::<String>::new());
        assert_eq!(dns1123_subdomain(&format!("{}.{}", a(63), a(63))), Vec::<String>::new());
        for bad in [
            "",
            "A",
            "aBc",
            "A-1",
            "-",
            "a-",
            "-a",
            "_",
            "a_b",
            ".",
            "a.",
            ".a",
            "a..b",
            "1.",
            ".1",
            "1..2",
            " ",
            "a b",
            "A.a",
            "aB.a",
            "ab.A",
            "A.1",
            "0.A",
            "1A.a",
            "A.B.C.D.E",
            "a.B.c.d.e",
            "a@b",
            "a,b",
            "a;b",
            "a:b",
            "a%b",
            "a?b",
            "a$b",
            "a.-b",
            "a-.b",
        ] {
            assert!(!dns1123_subdomain(bad).is_empty(), "{bad:?}");
        }
        assert_eq!(
            dns1123_subdomain("a..b"),
            [
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        );
        assert_eq!(dns1123_subdomain(&a(254)), ["must be no more than 253 characters"]);
    }

    #[test]
    fn qualified_names() {
        // TestIsQualifiedName.
        let longest = format!("{}/{}", a(253), "b".repeat(63));
        for ok in [
            "simple",
            "now-with-dashes",
            "1-starts-with-num",
            "1234",
            "simple/simple",
            "now-with-dashes/simple",
            "now-with-dashes/now-with-dashes",
            "now.with.dots/simple",
            "now-with.dashes-and.dots/simple",
            "1-num.2-num/3-num",
            "1234/5678",
            "1.2.3.4/5678",
            "Uppercase_Is_OK_123",
            "example.com/Uppercase_Is_OK_123",
            "requests.storage-foo",
            &a(63),
            &longest,
        ] {
            assert_eq!(qualified_name(ok), Vec::<String>::new(), "{ok:?}");
        }
        let too_long_prefix = format!("{}/abc", a(254));
        for bad in [
            "nospecialchars%^=@",
            "cantendwithadash-",
            "-cantstartwithadash-",
            "only/one/slash",
            "Example.com/abc",
            "example_com/abc",
            "example.com/",
            "/simple",
            "",
            &a(64),
            &too_long_prefix,
        ] {
            assert!(!qualified_name(bad).is_empty(), "{bad:?}");
        }
        let name_rule = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
        assert_eq!(qualified_name("/simple"), ["prefix part must be non-empty"]);
        assert_eq!(
            qualified_name("example.com/"),
            ["name part must be non-empty".to_owned(), format!("name part {name_rule}")]
        );
        assert_eq!(qualified_name(""), ["name part must be non-empty".to_owned(), format!("name part {name_rule}")]);
        assert_eq!(qualified_name("cantendwithadash-"), [format!("name part {name_rule}")]);
        assert_eq!(
            qualified_name("only/one/slash"),
            [format!(
                "a qualified name {name_rule} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )]
        );
        assert_eq!(
            qualified_name("Example.com/abc"),
            [
                "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        );
        assert_eq!(qualified_name(&too_long_prefix), ["prefix part must be no more than 253 characters"]);
        assert_eq!(qualified_name(&a(64)), ["name part must be no more than 63 characters"]);
        // Both parts wrong: the prefix's messages first.
        assert_eq!(qualified_name("_x/-y").len(), 2);
    }

    #[test]
    fn label_values() {
        // TestIsValidLabelValue.
        for ok in ["simple", "now-with-dashes", "1-starts-with-num", "end-with-num-1", "1234", "", "A_b.c-D", &a(63)] {
            assert_eq!(label_value(ok), Vec::<String>::new(), "{ok:?}");
        }
        for bad in [
            "nospecialchars%^=@",
            "Tama-nui-te-rā.is.Māori.sun",
            "\\backslashes\\are\\bad",
            "-starts-with-dash",
            "ends-with-dash-",
            ".starts.with.dot",
            "ends.with.dot.",
            &a(64),
        ] {
            assert!(!label_value(bad).is_empty(), "{bad:?}");
        }
        assert_eq!(label_value(&a(64)), ["must be no more than 63 characters"]);
        assert_eq!(
            label_value("-starts-with-dash"),
            [
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
            ]
        );
    }

    #[test]
    fn env_var_names() {
        // TestValidateEnv's names (pkg/apis/core/validation).
        for ok in ["ABC", "AbC_123", "abc", "a.b.c", "a-b-c", "_x", "-x", ".x", "POD_IP"] {
            assert_eq!(env_var_name(ok), Vec::<String>::new(), "{ok:?}");
        }
        let rule = "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')";
        assert_eq!(env_var_name("1BAD"), [rule]);
        assert_eq!(env_var_name("POD IP"), [rule]);
        assert_eq!(env_var_name(""), [rule]);
        assert_eq!(env_var_name("a=b"), [rule]);
        assert_eq!(env_var_name("."), ["must not be '.'"]);
        assert_eq!(env_var_name(".."), ["must not be '..'"]);
        assert_eq!(env_var_name("..x"), ["must not start with '..'"]);
        // Both rules broken: the character rule first.
        assert_eq!(env_var_name("..$x"), [rule, "must not start with '..'"]);
    }

    #[test]
    fn relaxed_env_var_names() {
        // The printable ASCII characters but '=', space included; no '.'/'..' rule.
        for ok in ["1BAD", "POD IP", "a:b;c", "~!@#$%^&*()", ".", "..", "..x", " ", "\"quoted\""] {
            assert_eq!(env_var_name_relaxed(ok), Vec::<String>::new(), "{ok:?}");
        }
        let rule = "a valid environment variable name must consist only of printable ASCII characters other than '='";
        for bad in ["a=b", "tab\t", "new\nline", "é", "del\x7f"] {
            assert_eq!(env_var_name_relaxed(bad), [rule], "{bad:?}");
        }
        assert_eq!(env_var_name_relaxed(""), ["environment variable name must be non-empty"]);
    }

    #[test]
    fn config_map_keys() {
        // TestIsConfigMapKey.
        for ok in [
            "a",
            "good",
            "good-good",
            "still.good",
            "this.is.also.good",
            ".so.is.this",
            "THIS_IS_GOOD",
            "so_is_this_17",
        ] {
            assert_eq!(config_map_key(ok), Vec::<String>::new(), "{ok:?}");
        }
        for bad in [".", "..", "..bad", "b*d", "bad!&bad", "", "a/b", &a(254)] {
            assert!(!config_map_key(bad).is_empty(), "{bad:?}");
        }
        assert_eq!(config_map_key(".."), ["must not be '..'"]);
        assert_eq!(
            config_map_key("b*d"),
            [
                "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
            ]
        );
        assert_eq!(config_map_key(&a(254)), ["must be no more than 253 characters"]);
    }

    #[test]
    fn port_names() {
        // TestIsValidPortName.
        for ok in ["telnet", "re-mail-ck", "pop3", "a", "a-1", "1-a", "a-1-b-2-c", "1-a-2-b-3", "http", "h2c"] {
            assert_eq!(port_name(ok), Vec::<String>::new(), "{ok:?}");
        }
        for bad in
            ["longerthan15characters", "", &a(16), "12345", "1-2-3-4", "-begin", "end-", "two--hyphens", "whois++"]
        {
            assert!(!port_name(bad).is_empty(), "{bad:?}");
        }
        assert_eq!(port_name("admin_port"), ["must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)"]);
        assert_eq!(port_name("12345"), ["must contain at least one letter or number (a-z, 0-9)"]);
        assert_eq!(port_name("two--hyphens"), ["must not contain consecutive hyphens"]);
        assert_eq!(port_name("-begin"), ["must not begin or end with a hyphen"]);
        assert_eq!(port_name(&a(16)), ["must be no more than 15 characters"]);
        assert_eq!(
            port_name(""),
            [
                "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
                "must contain at least one letter or number (a-z, 0-9)"
            ]
        );
        assert_eq!(
            port_name("-"),
            ["must contain at least one letter or number (a-z, 0-9)", "must not begin or end with a hyphen"]
        );
    }

    #[test]
    fn port_numbers() {
        // TestIsValidPortNum.
        for ok in [1, 2, 1000, 16384, 32768, 65535] {
            assert_eq!(port_num(ok), Vec::<String>::new(), "{ok}");
        }
        for bad in [0, -1, 65536, 100000, i64::MIN, i64::MAX] {
            assert_eq!(port_num(bad), ["must be between 1 and 65535, inclusive"], "{bad}");
        }
        assert_eq!(inclusive_range_error(0, 2147483647), "must be between 0 and 2147483647, inclusive");
    }

    #[test]
    fn http_header_names() {
        // TestIsHTTPHeaderName.
        for ok in [
            "Accept-Encoding",
            "Host",
            "If-Modified-Since",
            "X-Forwarded-For",
            "a",
            "ab",
            "abc",
            "a1",
            "-a",
            "a-",
            "a-b",
            "a-1",
            "a--1--2--b",
            "--abc-123",
            "A",
            "AB",
            "AbC",
            "A1",
            "-A",
            "A-",
            "A-B",
            "A-1",
            "A--1--2--B",
            "--123-ABC",
        ] {
            assert_eq!(http_header_name(ok), Vec::<String>::new(), "{ok:?}");
        }
        for bad in [
            "Host:",
            "X-Forwarded-For:",
            "X-@Home",
            "",
            "_",
            "a_",
            "_a",
            "1_",
            "1_2",
            ".",
            "a.",
            ".a",
            "a.b",
            "1.",
            ".1",
            "1.2",
            " ",
            "a ",
            " a",
            "a b",
            "1 ",
            " 1",
            "1 2",
            "#a#",
            "^",
            ",",
            ";",
            "=",
            "<",
            "?",
            "@",
            "{",
        ] {
            assert!(!http_header_name(bad).is_empty(), "{bad:?}");
        }
        assert_eq!(
            http_header_name("X Header"),
            [
                "a valid HTTP header must consist of alphanumeric characters or '-' (e.g. 'X-Header-Name', regex used for validation is '[-A-Za-z0-9]+')"
            ]
        );
    }

    #[test]
    fn regex_error_without_examples() {
        // The API server's wording when a rule has no examples (IsDomainPrefixedPath's).
        assert_eq!(regex_error("Invalid path", "[a-z]+", &[]), "Invalid path (regex used for validation is '[a-z]+')");
    }

    #[test]
    fn limits() {
        assert_eq!(TOTAL_ANNOTATION_SIZE_LIMIT_B, 262_144);
        assert_eq!((DNS1123_LABEL_MAX_LENGTH, DNS1123_SUBDOMAIN_MAX_LENGTH, LABEL_VALUE_MAX_LENGTH), (63, 253, 63));
    }
}
