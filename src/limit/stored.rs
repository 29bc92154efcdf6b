//! How a key's state reads back from Redis: the words the Lua parts write (`lua/limit_req/`), one
//! reader per algorithm in its own file (`BucketState::from_stored`, …), and the two kinds of
//! number they are made of. Pure: the store hands in the text it read.

/// The largest integer a Lua number (a double) holds exactly.
const MAX_EXACT: u64 = 1 << 53;

/// A non-negative integer as a script writes it (digits; a sorted-set score may also come as a
/// float's text, e.g. "1.7e+15"), at most 2^53.
pub fn integer(word: &str) -> Option<u64> {
    if let Ok(n) = word.parse::<u64>() {
        return (n <= MAX_EXACT).then_some(n);
    }
    let f = word.parse::<f64>().ok()?;
    (f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f <= MAX_EXACT as f64).then_some(f as u64)
}

/// A fraction as a script writes it (`%.17g`, which parses back to the exact double); finite.
pub fn fraction(word: &str) -> Option<f64> {
    word.parse::<f64>().ok().filter(|f| f.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_back_exactly() {
        assert_eq!(integer("1700000000000000"), Some(1_700_000_000_000_000));
        assert_eq!(integer("1.7e+15"), Some(1_700_000_000_000_000));
        assert_eq!(integer("1.5"), None);
        assert_eq!(integer("-1"), None);
        assert_eq!(integer("18014398509481984"), None);
        assert_eq!(fraction("0.10000000000000001"), Some(0.1));
        assert_eq!(fraction("inf"), None);
        assert_eq!(fraction("nan"), None);
        assert_eq!(fraction("x"), None);
    }
}
