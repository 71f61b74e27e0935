//! Resource quantities as the API server reads them (`k8s.io/apimachinery/pkg/api/resource`): `100m`, `1.5Gi`,
//! `1e3`. Parsed exactly (a decimal mantissa scaled by powers of ten and two), so that a request and its limit
//! compare as the API server compares them: `1Gi` is more than `1G`, `1000m` is `1`.

use std::cmp::Ordering;

use num_bigint::BigInt;
use num_traits::{Signed, Zero};

/// Why a text is not a quantity, in the API server's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QuantityError {
    /// The text does not have a quantity's shape.
    #[error("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
    Format,
    /// The number part cannot be read.
    #[error("unable to parse numeric part of quantity")]
    Numeric,
    /// The suffix is none the API server knows.
    #[error("unable to parse quantity's suffix")]
    Suffix,
}

/// An exact quantity: `mantissa × 10^exp10 × 2^exp2`.
#[derive(Debug, Clone)]
pub(crate) struct Quantity {
    mantissa: BigInt,
    exp10: i64,
    /// Only binary suffixes set this: 10 (`Ki`) to 60 (`Ei`).
    exp2: u32,
}

/// Reads a quantity as `ParseQuantity` does.
pub(crate) fn parse(text: &str) -> Result<Quantity, QuantityError> {
    if text.is_empty() {
        return Err(QuantityError::Format);
    }
    let parts = split(text)?;
    let (exp10, exp2) = suffix(parts.suffix).ok_or(QuantityError::Suffix)?;
    let digits = format!("{}{}", parts.whole, parts.fraction);
    let magnitude: BigInt =
        if digits.is_empty() { BigInt::zero() } else { digits.parse().map_err(|_| QuantityError::Numeric)? };
    let mantissa = if parts.negative { -magnitude } else { magnitude };
    let fraction_digits = i64::try_from(parts.fraction.len()).map_err(|_| QuantityError::Numeric)?;
    Ok(Quantity { mantissa, exp10: exp10 - fraction_digits, exp2 })
}

/// Reads a quantity from JSON, as `Quantity.UnmarshalJSON` does: a string (trimmed) or a bare number.
pub(crate) fn from_json(value: &serde_json::Value) -> Result<Quantity, QuantityError> {
    match value {
        serde_json::Value::String(text) => parse(text.trim()),
        serde_json::Value::Number(number) => parse(&number.to_string()),
        _ => Err(QuantityError::Format),
    }
}

impl Quantity {
    pub(crate) fn is_negative(&self) -> bool {
        self.mantissa.is_negative()
    }

    pub(crate) fn is_zero(&self) -> bool {
        self.mantissa.is_zero()
    }

    /// Has no fractional part (extended resources are counted in whole units).
    pub(crate) fn is_integer(&self) -> bool {
        if self.exp10 >= 0 || self.mantissa.is_zero() {
            return true;
        }
        let scaled = &self.mantissa << self.exp2;
        let divisor_digits = self.exp10.unsigned_abs();
        // A divisor with more digits than the dividend cannot divide it (and need not be built).
        if divisor_digits > scaled.magnitude().to_string().len() as u64 {
            return false;
        }
        let divisor = BigInt::from(10u32).pow(divisor_digits as u32);
        (scaled % divisor).is_zero()
    }

    /// Roughly `log10(|self|)`, to order quantities of very different sizes without building huge numbers.
    fn magnitude(&self) -> i64 {
        let digits = self.mantissa.magnitude().to_string().len() as i64;
        digits + self.exp10 + (i64::from(self.exp2) * 301 / 1000)
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        let sign = |q: &Quantity| q.mantissa.sign();
        if sign(self) != sign(other) {
            return sign(self).cmp(&sign(other));
        }
        if self.is_zero() {
            return Ordering::Equal; // both zero
        }
        // Far apart in size: the order of magnitude decides (reversed for negatives).
        let (a, b) = (self.magnitude(), other.magnitude());
        if (a - b).abs() > 2 {
            let by_size = a.cmp(&b);
            return if self.is_negative() { by_size.reverse() } else { by_size };
        }
        // Close in size, so their exponents are close too: scale both to the smaller exponents and compare.
        let exp10 = self.exp10.min(other.exp10);
        let exp2 = self.exp2.min(other.exp2);
        let scaled = |q: &Quantity| {
            let tens = u32::try_from(q.exp10 - exp10).unwrap_or(u32::MAX);
            (&q.mantissa * BigInt::from(10u32).pow(tens)) << (q.exp2 - exp2)
        };
        scaled(self).cmp(&scaled(other))
    }
}

/// A quantity's text cut as `parseQuantityString` cuts it.
struct Parts<'a> {
    negative: bool,
    /// The integer digits, leading zeros stripped.
    whole: &'a str,
    fraction: &'a str,
    suffix: &'a str,
}

fn split(text: &str) -> Result<Parts<'_>, QuantityError> {
    let bytes = text.as_bytes();
    let mut pos = 0;
    let negative = match bytes.first() {
        Some(b'-') => {
            pos += 1;
            true
        }
        Some(b'+') => {
            pos += 1;
            false
        }
        _ => false,
    };
    while bytes.get(pos) == Some(&b'0') {
        pos += 1;
    }
    let digits = |from: usize| from + bytes[from..].iter().take_while(|b| b.is_ascii_digit()).count();
    let whole_end = digits(pos);
    let whole = &text[pos..whole_end];
    pos = whole_end;
    let mut fraction = "";
    if bytes.get(pos) == Some(&b'.') {
        let end = digits(pos + 1);
        fraction = &text[pos + 1..end];
        pos = end;
    }
    let suffix_start = pos;
    pos += bytes[pos..].iter().take_while(|b| b"eEinumkKMGTP".contains(b)).count();
    if matches!(bytes.get(pos), Some(b'-' | b'+')) {
        pos += 1;
    }
    pos = digits(pos);
    if pos != bytes.len() {
        return Err(QuantityError::Format);
    }
    Ok(Parts { negative, whole, fraction, suffix: &text[suffix_start..] })
}

/// A suffix's power of ten and power of two (`quantitySuffixer.interpret`).
fn suffix(suffix: &str) -> Option<(i64, u32)> {
    let decimal = |exp: i64| Some((exp, 0));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => Some((0, 10)),
        "Mi" => Some((0, 20)),
        "Gi" => Some((0, 30)),
        "Ti" => Some((0, 40)),
        "Pi" => Some((0, 50)),
        "Ei" => Some((0, 60)),
        exponent => {
            let digits = exponent.strip_prefix(['e', 'E'])?;
            // Go's strconv.ParseInt(s, 10, 32): an optional sign, then digits.
            let value: i32 = digits.parse().ok()?;
            decimal(i64::from(value))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Quantity {
        parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn reads_what_the_api_server_reads() {
        for ok in [
            "0", "1", "100m", "0.5", ".5", "5.", "1.5Gi", "128Mi", "2k", "1e3", "1E-2", "+1", "-1", "500n", "1.", "-",
            ".",
        ] {
            assert!(parse(ok).is_ok(), "{ok} is a quantity");
        }
        assert_eq!(parse("").unwrap_err(), QuantityError::Format);
        for bad in ["1.2.3", "1 Gi", "1KB", "abc", "1Gi;rm", "10%", " 1"] {
            assert_eq!(parse(bad).unwrap_err(), QuantityError::Format, "{bad}");
        }
        for bad in ["1mi", "1e", "1Ki5", "1kk"] {
            assert_eq!(parse(bad).unwrap_err(), QuantityError::Suffix, "{bad}");
        }
        assert_eq!(
            QuantityError::Format.to_string(),
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        );
        assert_eq!(from_json(&serde_json::json!(" 1 ")).unwrap(), q("1"));
        assert_eq!(from_json(&serde_json::json!(0.5)).unwrap(), q("500m"));
        assert_eq!(from_json(&serde_json::json!(2)).unwrap(), q("2"));
    }

    #[test]
    fn compares_values_exactly() {
        assert!(q("1Gi") > q("1G"));
        assert_eq!(q("1000m"), q("1"));
        assert_eq!(q("0.1"), q("100m"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("-0"), q("0"));
        assert_eq!(q("1Ki"), q("1024"));
        assert!(q("-100m") < q("0") && q("-2") < q("-1"));
        assert!(q("256Mi") < q("1Gi") && q("64Mi") < q("256Mi"));
        assert!(q("1e100") > q("1Ei") && q("1e-100") < q("1n") && q("-1e100") < q("-1"));
        assert!(q("1.0000000001Gi") > q("1Gi"));
        assert!(q("1e999999999") > q("1e999999998"));
    }

    #[test]
    fn knows_negatives_zero_and_whole_numbers() {
        assert!(q("-100m").is_negative() && !q("-0").is_negative() && !q("1").is_negative());
        assert!(q("0").is_zero() && q("0.000").is_zero() && !q("1n").is_zero());
        for whole in ["1", "2000m", "1Ki", "1e3", "1.0", "0"] {
            assert!(q(whole).is_integer(), "{whole}");
        }
        for part in ["1.5", "500m", "1n", "1e-99999999"] {
            assert!(!q(part).is_integer(), "{part}");
        }
    }
}
