//! The codec's plain-JSON fast path in the core: short stored text holding
//! only JSON-native values (str, int, float, bool, None, list, dict) becomes
//! Python objects through `serde_json` and `pythonize`, without a round trip
//! through Python code. Anything else (tagged values, NaN/Infinity, integers
//! too large for 64 bits, lone surrogates, long text) is left to
//! `composeai._codec`, registered at import, which decodes it exactly as
//! before. Decoding never imports a module either way.

use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pythonize::Pythonizer;

static DECODER: GILOnceCell<Py<PyAny>> = GILOnceCell::new();

/// Registers `composeai._codec.loads`, which decodes what the fast path
/// declines.
#[pyfunction]
pub fn register_decoder(py: Python<'_>, loads: Py<PyAny>) {
    let _ = DECODER.set(py, loads);
}

/// The longest text the fast path takes. Measured against the codec's
/// C-accelerated `json` scanner (bench/codec_fast_path.py): the core wins on
/// numbers, arrays and small objects, loses on long strings and on large
/// string-heavy values (Python's scanner reuses key strings), so those stay
/// in Python.
const FAST_MAX: usize = 256;

/// Whether `text` is converted here, with the result `json.loads` gives:
/// short, no type tag, no integer literal that could exceed 64 bits, no
/// `-0` (both of which `serde_json` reads as floats).
fn is_plain(text: &str) -> bool {
    text.len() <= FAST_MAX && converts_exactly(text)
}

/// No type tag (written as is, or with its characters escaped), and no
/// number `serde_json` would read differently.
fn converts_exactly(text: &str) -> bool {
    if text.contains("$kind") || text.contains("\\u00") {
        return false;
    }
    let bytes = text.as_bytes();
    let mut run = 0u32;
    let mut prev = 0u8;
    for (i, &b) in bytes.iter().enumerate() {
        if b.is_ascii_digit() {
            run += 1;
            if run >= 19 {
                return false;
            }
            // `-0` alone, not an exponent such as `1e-07`.
            if b == b'0'
                && run == 1
                && prev == b'-'
                && !(i >= 2 && matches!(bytes[i - 2], b'e' | b'E'))
                && !matches!(bytes.get(i + 1), Some(b'.' | b'e' | b'E'))
            {
                return false;
            }
        } else {
            run = 0;
        }
        prev = b;
    }
    true
}

/// `text` decoded by the fast path, or `None` when it declines.
pub fn decode_plain<'py>(py: Python<'py>, text: &str) -> Option<Bound<'py, PyAny>> {
    if !is_plain(text) {
        return None;
    }
    transcode(py, text)
}

fn transcode<'py>(py: Python<'py>, text: &str) -> Option<Bound<'py, PyAny>> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_transcode::transcode(&mut de, Pythonizer::new(py)).ok()?;
    de.end().ok()?;
    Some(value)
}

/// `text` when it is a JSON integer of at most 18 digits (a replayed
/// counter's value, say), read without the general decoder.
fn json_int(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text).as_bytes();
    let canonical = match digits {
        [] => false,
        [b'0'] => true,
        [b'0', ..] => false,
        _ => digits.len() <= 18 && digits.iter().all(u8::is_ascii_digit),
    };
    if canonical {
        text.parse().ok()
    } else {
        None
    }
}

/// Decodes stored text: the fast path, else the registered Python codec.
pub fn decode<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    if let Some(n) = json_int(text) {
        return Ok(n.into_pyobject(py)?.into_any());
    }
    if let Some(value) = decode_plain(py, text) {
        return Ok(value);
    }
    match DECODER.get(py) {
        Some(loads) => loads.bind(py).call1((text,)),
        None => Err(pyo3::exceptions::PyRuntimeError::new_err(
            "composeai._codec is not loaded",
        )),
    }
}

/// The fast path alone, for the codec: the decoded value, or `default`
/// when the path declines the text. With `limited=False` (the bench's
/// comparison) it also converts long text.
#[pyfunction]
#[pyo3(signature = (text, default, limited=true))]
pub fn loads_plain<'py>(
    py: Python<'py>,
    text: &str,
    default: Bound<'py, PyAny>,
    limited: bool,
) -> Bound<'py, PyAny> {
    let value = if limited {
        decode_plain(py, text)
    } else if converts_exactly(text) {
        transcode(py, text)
    } else {
        None
    };
    value.unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::{is_plain, json_int};

    #[test]
    fn json_integers_are_read_directly_and_anything_else_declined() {
        assert_eq!(json_int("0"), Some(0));
        assert_eq!(json_int("-0"), Some(0));
        assert_eq!(json_int("42"), Some(42));
        assert_eq!(
            json_int("-123456789012345678"),
            Some(-123_456_789_012_345_678)
        );
        for text in [
            "",
            "-",
            "01",
            "+1",
            "1.0",
            "1e3",
            " 1",
            "1234567890123456789",
            "true",
        ] {
            assert_eq!(json_int(text), None, "{text:?}");
        }
    }

    #[test]
    fn plain_text_is_recognised() {
        assert!(is_plain(r#"{"a":[1,2.5,null,true,"x"]}"#));
        assert!(is_plain("-0.0"));
        assert!(is_plain("-0e1"));
        assert!(is_plain("1e-07"));
        assert!(is_plain("123456789012345678"));
    }

    #[test]
    fn objects_long_texts_big_integers_and_negative_zero_are_declined() {
        assert!(!is_plain(r#"{"$kind":"tuple","value":[1]}"#));
        assert!(!is_plain(r#"{"\u0024kind":"tuple"}"#));
        assert!(!is_plain(&"1,".repeat(200)));
        assert!(!is_plain("1234567890123456789"));
        assert!(!is_plain("[-0]"));
        assert!(!is_plain("-0"));
    }
}
