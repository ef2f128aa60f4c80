//! The codec's plain-JSON fast path in the core: stored text holding only
//! JSON-native values (str, int, float, bool, None, list, dict) becomes
//! Python objects through `serde_json` and `pythonize` without a round trip
//! through Python code. Anything else (tagged values, NaN/Infinity, integers
//! too large for 64 bits, lone surrogates) is left to `composeai._codec`,
//! registered at import, which decodes it exactly as before; decoding never
//! imports a module either way.

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

/// Whether `text` can be converted here with the result `json.loads` gives:
/// no type tag, and no integer literal that could exceed 64 bits or `-0`
/// (which `serde_json` reads as floats).
fn is_plain(text: &str) -> bool {
    let bytes = text.as_bytes();
    if bytes.windows(5).any(|w| w == b"$kind") || text.contains("\\u00") {
        return false;
    }
    let mut run = 0usize;
    for (i, &b) in bytes.iter().enumerate() {
        if b.is_ascii_digit() {
            run += 1;
            if run >= 19 {
                return false;
            }
            if b == b'0' && run == 1 && i > 0 && bytes[i - 1] == b'-' {
                let next = bytes.get(i + 1).copied();
                if !matches!(next, Some(b'.' | b'e' | b'E')) {
                    return false;
                }
            }
        } else {
            run = 0;
        }
    }
    true
}

/// `text` decoded by the fast path, or `None` when it declines.
pub fn decode_plain<'py>(py: Python<'py>, text: &str) -> Option<Bound<'py, PyAny>> {
    if !is_plain(text) {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_transcode::transcode(&mut de, Pythonizer::new(py)).ok()?;
    de.end().ok()?;
    Some(value)
}

/// Decodes stored text: the fast path, else the registered Python codec.
pub fn decode<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
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

/// The fast path alone, for the codec and the bench: the decoded value, or
/// `default` when the text is not plain JSON.
#[pyfunction]
pub fn loads_plain<'py>(
    py: Python<'py>,
    text: &str,
    default: Bound<'py, PyAny>,
) -> Bound<'py, PyAny> {
    decode_plain(py, text).unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::is_plain;

    #[test]
    fn plain_text_is_recognised() {
        assert!(is_plain(r#"{"a":[1,2.5,null,true,"x"]}"#));
        assert!(is_plain("-0.0"));
        assert!(is_plain("-0e1"));
        assert!(is_plain("123456789012345678"));
    }

    #[test]
    fn tags_big_integers_and_negative_zero_are_declined() {
        assert!(!is_plain(r#"{"$kind":"tuple","value":[1]}"#));
        assert!(!is_plain(r#"{"\u0024kind":"tuple"}"#));
        assert!(!is_plain("1234567890123456789"));
        assert!(!is_plain("[-0]"));
        assert!(!is_plain("-0"));
    }
}
