//! Resource quantities as the API server reads them (`k8s.io/apimachinery/pkg/api/resource`, `ParseQuantity`):
//! `100m`, `1.5Gi`, `1e3`, with its error messages.
//!
//! A quantity is kept exactly, as `±magnitude × 10^exp10 × 2^exp2`, so that a request and its limit compare as the
//! API server compares them (`1Gi` is more than `1G`, `1000m` is `1`). "Exactly" means the API server's value, not
//! the text's: like `ParseQuantity`, parsing rounds a value finer than a nano unit up (away from zero) to whole
//! nano units (`0.1n` is `1n`), and caps a binary-suffixed value at ±(2^63 − 1) (`16Ei` is `8Ei` less one).

use std::cmp::Ordering;

use num_bigint::BigUint;
use num_traits::Zero;

/// Why a text is not a quantity, in the API server's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QuantityError {
    /// `ErrFormatWrong`: the text does not have a quantity's shape.
    #[error("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
    Format,
    /// `ErrNumeric`: the number part has no digit where the API server needs one (`.e-20`).
    #[error("unable to parse numeric part of quantity")]
    Numeric,
    /// `ErrSuffix`: the suffix is none the API server knows (`1mi`, `1e`, `1Ki5`).
    #[error("unable to parse quantity's suffix")]
    Suffix,
}

/// A quantity's exact value (as the API server holds it): `±magnitude × 10^exp10 × 2^exp2`. Zero is never negative,
/// and `exp10 >= -9` (parsing rounds to nano units), so equal values may be spelt differently (`1000m` and `1`):
/// compare with `==` and `cmp`, which compare values, never the fields.
#[derive(Debug, Clone)]
pub(crate) struct Quantity {
    negative: bool,
    magnitude: BigUint,
    exp10: i64,
    /// Only binary suffixes set it: 10 (`Ki`) to 60 (`Ei`).
    exp2: u32,
}

/// Reads `text` as `ParseQuantity` does: no surrounding spaces, an optional sign, digits with an optional `.`, and
/// an optional suffix: binary (`Ki` to `Ei`), decimal (`n`, `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`) or a decimal
/// exponent (`e3`, `E-2`).
pub(crate) fn parse(text: &str) -> Result<Quantity, QuantityError> {
    if text.is_empty() {
        return Err(QuantityError::Format);
    }
    let parts = Parts::split(text.as_bytes())?;
    let suffix = Suffix::interpret(parts.suffix).ok_or(QuantityError::Suffix)?;
    let (exp10, exp2) = parts.exponents(suffix)?;
    let mut quantity = Quantity { negative: parts.negative, magnitude: parts.digits()?, exp10, exp2 };
    quantity.round_up_to_nano_units();
    if matches!(suffix, Suffix::Binary(_)) && quantity.cmp_magnitude(&max_int64()) == Ordering::Greater {
        // The API server caps binary-suffixed values (only those) at the largest int64.
        quantity = Quantity { negative: quantity.negative, ..max_int64() };
    }
    Ok(quantity.normalized())
}

/// Reads a quantity from a pod's JSON as the API server's `Quantity.UnmarshalJSON` does: a string (surrounding
/// white space trimmed), a bare number (`1`, `0.5`), or `null` (zero).
///
/// The API server parses a string's raw JSON text, escapes undecoded. As serde_json writes it (what we send), that
/// text differs from the decoded string only by the escapes of control characters, `"` and `\`, none of which a
/// quantity may hold: so a string holding a control character is refused, as the API server would refuse the
/// backslash it sees. A number is read as serde_json holds it: an integer exactly, a fraction or an exponent as an
/// `f64` (so rounded beyond about 16 significant digits, which the API server would read exactly).
pub(crate) fn from_json(value: &serde_json::Value) -> Result<Quantity, QuantityError> {
    match value {
        serde_json::Value::Null => Ok(Quantity::zero()),
        serde_json::Value::String(text) if text.bytes().any(|b| b < b' ') => Err(QuantityError::Format),
        serde_json::Value::String(text) => parse(text.trim()),
        serde_json::Value::Number(number) => parse(&number.to_string()),
        // The API server parses `true`, `[…]` and `{…}` as text, which no quantity starts like.
        serde_json::Value::Bool(_) | serde_json::Value::Array(_) | serde_json::Value::Object(_) => {
            Err(QuantityError::Format)
        }
    }
}

impl Quantity {
    /// The value in nano units (exact: parsing rounds to them), or `u128::MAX` for a value too large to count in
    /// them; 0 for a negative one. For sums of requests, which a pod cannot make that large.
    pub(crate) fn saturating_nanos(&self) -> u128 {
        if self.negative {
            return 0;
        }
        // exp10 >= -9 (see the type), so the shift is a whole power of ten; past 10^38 nothing fits a u128.
        let Ok(shift) = u32::try_from(self.exp10 - NANO_EXP10) else { return 0 };
        if shift > 38 || self.magnitude.bits() + u64::from(self.exp2) > 128 {
            return u128::MAX;
        }
        let nanos = (&self.magnitude << self.exp2) * BigUint::from(10u32).pow(shift);
        u128::try_from(nanos).unwrap_or(u128::MAX)
    }

    fn zero() -> Quantity {
        Quantity { negative: false, magnitude: BigUint::zero(), exp10: 0, exp2: 0 }
    }

    /// Less than zero (`Sign() < 0`): the API server refuses negative requests and limits.
    pub(crate) fn is_negative(&self) -> bool {
        self.negative
    }

    pub(crate) fn is_zero(&self) -> bool {
        self.magnitude.is_zero()
    }

    /// Has no fractional part: extended resources are counted in whole units.
    pub(crate) fn is_integer(&self) -> bool {
        if self.exp10 >= 0 || self.is_zero() {
            return true;
        }
        // At most nine decimal places (parsing rounds to nano units), so the divisor fits a u64.
        debug_assert!(self.exp10 >= NANO_EXP10);
        let places = u32::try_from(-self.exp10).map_or(NANO_PLACES, |places| places.min(NANO_PLACES));
        ((&self.magnitude << self.exp2) % 10u64.pow(places)).is_zero()
    }

    /// Rounds a value finer than a nano unit up, away from zero, to whole nano units, as `ParseQuantity` does.
    fn round_up_to_nano_units(&mut self) {
        if self.exp10 >= NANO_EXP10 || self.is_zero() {
            return;
        }
        let scaled = &self.magnitude << self.exp2;
        let places = NANO_EXP10 - self.exp10; // > 0: the decimal places beyond the nano unit
        let nanos = if i128::from(places) * LOG2_10_BELOW >= i128::from(scaled.bits()) * LOG2_SCALE {
            // 10^places > scaled, so a positive value under one nano unit: it rounds up to one. (This also keeps
            // `1e-2000000000` from building a power of ten with two billion digits.)
            BigUint::from(1u32)
        } else {
            // Here 10^places has fewer bits than `scaled`, which came from the text: cheap enough (and `places` is
            // far below u32::MAX).
            let divisor = BigUint::from(10u32).pow(u32::try_from(places).unwrap_or(u32::MAX));
            let (quotient, remainder) = (&scaled / &divisor, &scaled % &divisor);
            if remainder.is_zero() { quotient } else { quotient + 1u32 }
        };
        *self = Quantity { negative: self.negative, magnitude: nanos, exp10: NANO_EXP10, exp2: 0 };
    }

    /// -1, 0 or 1 (`Sign()`).
    fn signum(&self) -> i8 {
        match (self.is_zero(), self.negative) {
            (true, _) => 0,
            (false, true) => -1,
            (false, false) => 1,
        }
    }

    /// Zero as one value: not negative, no exponents.
    fn normalized(self) -> Quantity {
        if self.is_zero() { Quantity::zero() } else { self }
    }

    /// Compares absolute values exactly, without building powers of ten larger than the mantissas: values whose
    /// sizes (in bits) are far apart are ordered by size alone.
    fn cmp_magnitude(&self, other: &Quantity) -> Ordering {
        match (self.is_zero(), other.is_zero()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            (false, false) => {}
        }
        // log2|self| - log2|other| lies strictly between `low` and `high` (in units of 1/LOG2_SCALE bits): each
        // mantissa (with its power of two) m has bits(m) - 1 <= log2(m) < bits(m), and 10^d is 2^(d × log2 10).
        let bits = |q: &Quantity| i128::from(q.magnitude.bits()) + i128::from(q.exp2);
        let bits_apart = bits(self) - bits(other);
        let tens_apart = i128::from(self.exp10) - i128::from(other.exp10);
        let (log2_10_low, log2_10_high) =
            if tens_apart >= 0 { (LOG2_10_BELOW, LOG2_10_ABOVE) } else { (LOG2_10_ABOVE, LOG2_10_BELOW) };
        let low = (bits_apart - 1) * LOG2_SCALE + tens_apart * log2_10_low;
        let high = (bits_apart + 1) * LOG2_SCALE + tens_apart * log2_10_high;
        if low >= 0 {
            return Ordering::Greater;
        }
        if high <= 0 {
            return Ordering::Less;
        }
        // Close in size, so their powers of ten are at most about as far apart as their mantissas are long (far
        // below u32::MAX): bring both to the smaller exponents and compare the integers.
        let exp10 = self.exp10.min(other.exp10);
        let exp2 = self.exp2.min(other.exp2);
        let scaled = |q: &Quantity| {
            let tens = u32::try_from(q.exp10 - exp10).unwrap_or(u32::MAX);
            (&q.magnitude * BigUint::from(10u32).pow(tens)) << (q.exp2 - exp2)
        };
        scaled(self).cmp(&scaled(other))
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

/// The order of values (`Quantity.Cmp`): `-1 < -0.5 < 0 == -0 < 1n < 1 == 1000m < 1k < 1Ki`.
impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        match self.signum().cmp(&other.signum()) {
            Ordering::Equal if self.negative => self.cmp_magnitude(other).reverse(),
            Ordering::Equal => self.cmp_magnitude(other),
            by_sign => by_sign,
        }
    }
}

/// The power of ten of a nano unit, the finest the API server keeps.
const NANO_EXP10: i64 = -9;
const NANO_PLACES: u32 = 9;
/// log2(10) lies strictly between these, in units of 1/LOG2_SCALE: 3.3219 < 3.32192809… < 3.3220.
const LOG2_10_BELOW: i128 = 33_219;
const LOG2_10_ABOVE: i128 = 33_220;
const LOG2_SCALE: i128 = 10_000;

/// The cap of binary-suffixed values: the largest int64.
fn max_int64() -> Quantity {
    Quantity { negative: false, magnitude: BigUint::from(i64::MAX.unsigned_abs()), exp10: 0, exp2: 0 }
}

/// A quantity's text cut as `parseQuantityString` cuts it: `[+-]?0*` `[0-9]*` (`.` `[0-9]*`)? `[eEinumkKMGTP]*`
/// `[+-]?` `[0-9]*`.
struct Parts<'a> {
    negative: bool,
    /// The integer digits after the leading zeros (the API server's `num`, where empty stands for "0").
    whole: &'a [u8],
    /// The digits after the `.` (`denom`).
    fraction: &'a [u8],
    /// Whether the number part, leading zeros included, has any digit: the API server's slow path needs one.
    has_digit: bool,
    suffix: &'a [u8],
}

/// A suffix as `quantitySuffixer.interpret` reads it.
#[derive(Clone, Copy)]
enum Suffix {
    /// A power of ten: none, `n` to `E` (DecimalSI), or `e`/`E` and an exponent (DecimalExponent). The API server
    /// reads the exponent as an int64 and then keeps its low 32 bits (`int32(parsed)`): `1e4294967296` is 1.
    Decimal(i32),
    /// A power of two: `Ki` (10) to `Ei` (60).
    Binary(u8),
}

impl Suffix {
    fn interpret(suffix: &[u8]) -> Option<Suffix> {
        Some(match suffix {
            b"" => Suffix::Decimal(0),
            b"n" => Suffix::Decimal(-9),
            b"u" => Suffix::Decimal(-6),
            b"m" => Suffix::Decimal(-3),
            b"k" => Suffix::Decimal(3),
            b"M" => Suffix::Decimal(6),
            b"G" => Suffix::Decimal(9),
            b"T" => Suffix::Decimal(12),
            b"P" => Suffix::Decimal(15),
            b"E" => Suffix::Decimal(18),
            b"Ki" => Suffix::Binary(10),
            b"Mi" => Suffix::Binary(20),
            b"Gi" => Suffix::Binary(30),
            b"Ti" => Suffix::Binary(40),
            b"Pi" => Suffix::Binary(50),
            b"Ei" => Suffix::Binary(60),
            [b'e' | b'E', exponent @ ..] if !exponent.is_empty() => {
                // Go's strconv.ParseInt(s, 10, 64): an optional sign, then decimal digits, within an int64; the
                // suffix holds only ASCII, so it is UTF-8.
                let exponent: i64 = std::str::from_utf8(exponent).ok()?.parse().ok()?;
                // Truncated to 32 bits, as the API server does.
                Suffix::Decimal(exponent as i32)
            }
            _ => return None,
        })
    }
}

impl<'a> Parts<'a> {
    fn split(text: &'a [u8]) -> Result<Parts<'a>, QuantityError> {
        let digits_from = |from: usize| from + text[from..].iter().take_while(|b| b.is_ascii_digit()).count();
        let (negative, mut pos) = match text.first() {
            Some(b'-') => (true, 1),
            Some(b'+') => (false, 1),
            _ => (false, 0),
        };
        let number_start = pos;
        pos += text[pos..].iter().take_while(|&&b| b == b'0').count();
        let whole_end = digits_from(pos);
        let whole = &text[pos..whole_end];
        pos = whole_end;
        let mut fraction: &[u8] = &[];
        if text.get(pos) == Some(&b'.') {
            let fraction_end = digits_from(pos + 1);
            fraction = &text[pos + 1..fraction_end];
            pos = fraction_end;
        }
        let has_digit = text[number_start..pos].iter().any(u8::is_ascii_digit);
        let suffix_start = pos;
        pos += text[pos..].iter().take_while(|b| b"eEinumkKMGTP".contains(b)).count();
        if matches!(text.get(pos), Some(b'-' | b'+')) {
            pos += 1;
        }
        if digits_from(pos) != text.len() {
            return Err(QuantityError::Format);
        }
        Ok(Parts { negative, whole, fraction, has_digit, suffix: &text[suffix_start..] })
    }

    /// The powers of ten and two of the value's last digit, as `ParseQuantity` computes them. It takes one of two
    /// paths, whose 32-bit scale arithmetic differs only for exponents near ±2^31 (where it wraps, and so do we);
    /// the slow one refuses a number part without digits (`.e-20`).
    fn exponents(&self, suffix: Suffix) -> Result<(i64, u32), QuantityError> {
        // Lengths beyond i32 (a 2 GiB quantity) cannot reach us; saturating keeps the arithmetic defined.
        let whole_len = i32::try_from(self.whole.len().max(1)).unwrap_or(i32::MAX);
        let fraction_len = i32::try_from(self.fraction.len()).unwrap_or(i32::MAX);
        match suffix {
            Suffix::Decimal(exponent) => {
                let fast_scale = exponent.wrapping_sub(fraction_len);
                if whole_len.saturating_add(fraction_len) <= MAX_INT64_DIGITS && i64::from(fast_scale) >= NANO_EXP10 {
                    Ok((i64::from(fast_scale), 0))
                } else if !self.has_digit {
                    Err(QuantityError::Numeric)
                } else {
                    // inf.Dec's scale is the negated exponent: fraction digits plus the negated suffix exponent.
                    let dec_scale = fraction_len.wrapping_add(exponent.wrapping_neg());
                    Ok((-i64::from(dec_scale), 0))
                }
            }
            Suffix::Binary(exponent) => {
                // The fast path's precision estimate (`exponent × 0.3` is a whole number for 10..=60). Without
                // digits there is no fraction, so only a short precision sends it to the slow path, which refuses it.
                let precision = 15 - whole_len - i32::from(exponent * 3 / 10) - 1;
                if !self.has_digit && precision < 0 {
                    return Err(QuantityError::Numeric);
                }
                Ok((-i64::from(fraction_len), u32::from(exponent)))
            }
        }
    }

    /// The number part's digits as one integer (the fraction's included); cheap for the usual short numbers.
    fn digits(&self) -> Result<BigUint, QuantityError> {
        let digits = self.whole.iter().chain(self.fraction);
        if self.whole.len() + self.fraction.len() <= 19 {
            // 19 decimal digits fit a u64.
            return Ok(BigUint::from(digits.fold(0u64, |n, d| n * 10 + u64::from(d - b'0'))));
        }
        let values: Vec<u8> = digits.map(|d| d - b'0').collect();
        // Every value is a decimal digit, so this cannot fail; the error is for form's sake.
        BigUint::from_radix_be(&values, 10).ok_or(QuantityError::Numeric)
    }
}

/// `maxInt64Factors`: the most digits the API server's fast path reads into an int64.
const MAX_INT64_DIGITS: i32 = 18;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(text: &str) -> Quantity {
        parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    /// `mantissa × 10^exp10`, the Go tests' `decQuantity(mantissa, exp10, _)`.
    fn dec(mantissa: i64, exp10: i64) -> Quantity {
        q(&format!("{mantissa}e{exp10}"))
    }

    #[test]
    fn parses_the_go_table() {
        // TestQuantityParse's table: the text, then the value as mantissa and power of ten.
        let table: &[(&str, i64, i64)] = &[
            ("0", 0, 0),
            ("0n", 0, 0),
            ("0u", 0, 0),
            ("0m", 0, 0),
            ("0Ki", 0, 0),
            ("0k", 0, 0),
            ("0Mi", 0, 0),
            ("0M", 0, 0),
            ("0Gi", 0, 0),
            ("0G", 0, 0),
            ("0Ti", 0, 0),
            ("0T", 0, 0),
            ("1", 1, 0),
            ("1Ki", 1024, 0),
            ("8Ki", 8 * 1024, 0),
            ("7Mi", 7 << 20, 0),
            ("6Gi", 6 << 30, 0),
            ("5Ti", 5 << 40, 0),
            ("4Pi", 4 << 50, 0),
            ("3Ei", 3 << 60, 0),
            ("10Ti", 10 << 40, 0),
            ("100Ti", 100 << 40, 0),
            ("5n", 5, -9),
            ("4u", 4, -6),
            ("3m", 3, -3),
            ("9", 9, 0),
            ("8k", 8, 3),
            ("50k", 5, 4),
            ("7M", 7, 6),
            ("6G", 6, 9),
            ("5T", 5, 12),
            ("40T", 4, 13),
            ("300T", 3, 14),
            ("2P", 2, 15),
            ("1E", 1, 18),
            ("1E-3", 1, -3),
            ("1e3", 1, 3),
            ("1E6", 1, 6),
            ("1e9", 1, 9),
            ("1E12", 1, 12),
            ("1e15", 1, 15),
            ("1E18", 1, 18),
            ("1e14", 1, 14),
            ("1e13", 1, 13),
            ("100.035k", 100035, 0),
            ("0.001", 1, -3),
            ("0.0005k", 5, -1),
            ("0.005", 5, -3),
            ("0.05", 5, -2),
            ("0.5", 5, -1),
            ("0.00050k", 5, -1),
            ("0.00500", 5, -3),
            ("0.05000", 5, -2),
            ("0.50000", 5, -1),
            ("0.5e0", 5, -1),
            ("0.5e-1", 5, -2),
            ("0.5e-2", 5, -3),
            ("10.035M", 10035, 3),
            ("1.2e3", 12, 2),
            ("1.3E+6", 13, 5),
            ("1.40e9", 14, 8),
            ("1.53E12", 153, 10),
            ("1.6e15", 16, 14),
            ("1.7E18", 17, 17),
            ("9.01", 901, -2),
            ("8.1k", 81, 2),
            ("7.123456M", 7123456, 0),
            ("6.987654321G", 6987654321, 0),
            ("5.444T", 5444, 9),
            ("40.1T", 401, 11),
            ("300.2T", 3002, 11),
            ("2.5P", 25, 14),
            ("1.01E", 101, 16),
            // Rounded up to nano units.
            ("3.001n", 4, -9),
            ("1.1E-9", 2, -9),
            ("0.0000000001", 1, -9),
            ("0.0000000005", 1, -9),
            ("0.00000000050", 1, -9),
            ("0.5e-9", 1, -9),
            ("0.9n", 1, -9),
            ("0.00000012345", 124, -9),
            ("0.00000012354", 124, -9),
            // Capped at the largest int64.
            ("9Ei", i64::MAX, 0),
            ("9223372036854775807Ki", i64::MAX, 0),
            ("12E", 12, 18),
            ("100.035Ki", 10243584, -2),
            ("0.5Mi", 1 << 19, 0),
            ("0.05Gi", 536870912, -1),
            ("0.025Ti", 274877906944, -1),
            ("0.000000000001Ki", 2, -9),
            (".001", 1, -3),
            (".0001k", 100, -3),
            ("1.", 1, 0),
            ("1.G", 1, 9),
        ];
        for &(text, mantissa, exp10) in table {
            assert_eq!(q(text), dec(mantissa, exp10), "{text}");
            // The Go test's negative and explicitly positive versions.
            assert_eq!(q(&format!("-{text}")), dec(-mantissa, exp10), "-{text}");
            assert_eq!(q(&format!("+{text}")), dec(mantissa, exp10), "+{text}");
        }
    }

    #[test]
    fn reads_odd_shapes_as_the_api_server_does() {
        // No digits at all is zero where the API server's fast path reads it...
        for zero in [".", "-", "+", "-.", "+.", "e5", "Ki", "k", "-0", "+0", "000", "-0.0e-20", "0Ei"] {
            assert!(q(zero).is_zero(), "{zero}");
        }
        // ...and an error where its slow path needs a digit.
        for numeric in ["e-20", ".e-20", "-e-20", "Pi", "Ei", "-Ei", ".Ei"] {
            assert_eq!(parse(numeric).unwrap_err(), QuantityError::Numeric, "{numeric}");
        }
        assert_eq!(q("1e+3"), q("1k"));
        assert_eq!(q("00000000000000000000000000001"), q("1"));
        assert_eq!(q("0.0000000001234567890123456789"), q("1n"));
        assert_eq!(q("0.0000001234567890123456789"), q("124n"));
    }

    #[test]
    fn refuses_what_the_api_server_refuses() {
        assert_eq!(parse("").unwrap_err(), QuantityError::Format);
        // TestQuantityParse's invalid list, surrounding spaces included, and more.
        for bad in [
            "1.1.M", "1+1.0M", "aoeu", "-3.01e-", " 1", "1 ", "1.2.3", "1 Gi", "1KB", "abc", "1Gi;rm", "10%", "1e5e5",
            "1Ki-", "\u{a0}1", "1\n", "１",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        for format in ["1.1.M", "0.1am", "aoeu", " 1", "1 ", "1e5e5"] {
            assert_eq!(parse(format).unwrap_err(), QuantityError::Format, "{format:?}");
        }
        for suffix in
            ["0.1mi", ".5i", "1i", "-3.01i", "-3.01e-", "1e", "1Ki5", "1e+", "1ee3", "1eKi", "1Kii", "1kk", "1-5", "1+"]
        {
            assert_eq!(parse(suffix).unwrap_err(), QuantityError::Suffix, "{suffix:?}");
        }
        // An exponent beyond int64 is a bad suffix.
        assert_eq!(parse("1e9223372036854775808").unwrap_err(), QuantityError::Suffix);
        assert_eq!(
            QuantityError::Format.to_string(),
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        );
        assert_eq!(QuantityError::Numeric.to_string(), "unable to parse numeric part of quantity");
        assert_eq!(QuantityError::Suffix.to_string(), "unable to parse quantity's suffix");
    }

    #[test]
    fn rounds_and_caps_as_the_api_server_does() {
        assert_eq!(q("0.1n"), q("1n"));
        assert_eq!(q("1e-100"), q("1n"));
        assert_eq!(q("-1e-100"), q("-1n"));
        assert_eq!(q("1.0000000001Ki"), q("1024000000103n"));
        assert_eq!(q("-1.0000000001Ki"), q("-1024000000103n"));
        // Binary values only are capped.
        assert_eq!(q("8Ei"), q("9223372036854775807"));
        assert_eq!(q("16Ei"), q("8Ei"));
        assert_eq!(q("-16Ei"), q("-9223372036854775807"));
        assert_eq!(q("100000000000000000000Ki"), q("9223372036854775807"));
        assert_eq!(q("7.99999999999999999999Ei"), q("8Ei"));
        assert!(q("16E") > q("16Ei"));
        assert!(q("1e100") > q("9223372036854775807"));
    }

    #[test]
    fn wraps_exponents_as_the_api_server_does() {
        // Go keeps the low 32 bits of the exponent, and its 32-bit scale arithmetic wraps (checked against Go).
        assert_eq!(q("1e4294967296"), q("1"));
        assert_eq!(q("1e4294967295"), q("0.1"));
        assert_eq!(q("1e-4294967295"), q("10"));
        assert_eq!(q("1e9223372036854775807"), q("0.1"));
        assert_eq!(q("1e-9223372036854775808"), q("1"));
        assert_eq!(q("1.5e-2147483648"), q("15e2147483647"));
        assert_eq!(q("1e2147483647"), q("10e2147483646"));
        assert_eq!(q("1.55e2147483647"), q("155e2147483645"));
        assert!(q("2e2147483647") > q("1e2147483647"));
        assert!(q("-1e2147483647") > q("-2e2147483647"));
        // These the API server takes minutes over; their values are cheap here.
        assert_eq!(q("1e-2147483647"), q("1n"));
        assert!(q("1e-2147483648") > q("1e2147483647"));
    }

    #[test]
    fn compares_values_exactly() {
        // TestQuantityCmp.
        assert_eq!(q("0").cmp(&q("0")), Ordering::Equal);
        assert_eq!(q("100m").cmp(&q("50m")), Ordering::Greater);
        assert_eq!(q("50m").cmp(&q("100m")), Ordering::Less);
        assert_eq!(q("10000T").cmp(&q("100Gi")), Ordering::Greater);
        // Values, not spellings.
        assert!(q("1Gi") > q("1G"));
        assert_eq!(q("1000m"), q("1"));
        assert_eq!(q("0.1"), q("100m"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("-0"), q("0"));
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("1Ei"), q("1152921504606846976"));
        assert!(q("1Ei") < q("1152921504606846977") && q("1Ei") > q("1152921504606846975"));
        assert_eq!(q("0.5Ki"), q("512"));
        assert_eq!(q("1.5Gi"), q("1536Mi"));
        assert!(q("-100m") < q("0") && q("-2") < q("-1") && q("-1") < q("1n"));
        assert!(q("256Mi") < q("1Gi") && q("64Mi") < q("256Mi"));
        assert!(q("1e100") > q("1Ei") && q("-1e100") < q("-1"));
        assert!(q("1.0000000001Gi") > q("1Gi"));
        assert!(q("1e999999999") > q("1e999999998"));
        assert!(q("123456789012345678901234567890") > q("123456789012345678901234567889"));
        assert_eq!(q("123456789012345678901234567890"), q("123456789012345678901234.56789M"));
        let mut sorted = ["1Gi", "-1", "0", "999m", "1G", "1", "-1Ki", "1n"].map(q);
        sorted.sort();
        assert_eq!(sorted, ["-1Ki", "-1", "0", "1n", "999m", "1", "1G", "1Gi"].map(q));
    }

    #[test]
    fn knows_negatives_zero_and_whole_numbers() {
        assert!(q("-100m").is_negative() && !q("-0").is_negative() && !q("1").is_negative());
        assert!(!q("-0.0000n").is_negative() && q("-1e-100").is_negative());
        assert!(q("0").is_zero() && q("0.000").is_zero() && q("-0Ki").is_zero() && !q("1n").is_zero());
        for whole in ["1", "2000m", "1Ki", "1e3", "1.0", "0", "-3", "0.5Ki", "1.5Gi", "1e30", "9223372036854776"] {
            assert!(q(whole).is_integer(), "{whole}");
        }
        for part in ["1.5", "500m", "1n", "1e-99999999", "0.1Ki", "1.0000000001Ki", "-0.5"] {
            assert!(!q(part).is_integer(), "{part}");
        }
    }

    #[test]
    fn reads_json_as_the_api_server_does() {
        // TestJSONWhitespace, and the other JSON values.
        for (value, expected) in [
            (json!(" 1"), "1"),
            (json!("1 "), "1"),
            (json!("\u{a0}2Gi\u{2003}"), "2Gi"),
            (json!(1), "1"),
            (json!(10), "10"),
            (json!(-1), "-1"),
            (json!(0.5), "500m"),
            (json!(1e3), "1k"),
            (json!(1.5e-7), "150n"),
            (json!(12345678901234567890u64), "12345678901234567890"),
            (json!(null), "0"),
        ] {
            assert_eq!(from_json(&value), Ok(q(expected)), "{value}");
        }
        for refused in
            [json!(""), json!("1\n"), json!("\t1"), json!(true), json!([1]), json!({"cpu": 1}), json!("1 Gi")]
        {
            assert_eq!(from_json(&refused), Err(QuantityError::Format), "{refused}");
        }
        assert_eq!(from_json(&json!("1mi")), Err(QuantityError::Suffix));
    }
}
