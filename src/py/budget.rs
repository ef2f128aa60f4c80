//! `BudgetMeter`: an active budget, charged after every model call.

use crate::budget::Meter;
use pyo3::prelude::*;

#[pyclass(name = "BudgetMeter", module = "composeai._core", frozen)]
pub struct PyBudgetMeter {
    inner: Meter,
}

#[pymethods]
impl PyBudgetMeter {
    #[new]
    #[pyo3(signature = (usd, tokens, usd_text, tokens_text, span_kind, span_name, baseline_tokens=0, baseline_usd=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        usd: Option<f64>,
        tokens: Option<i64>,
        usd_text: String,
        tokens_text: String,
        span_kind: String,
        span_name: String,
        baseline_tokens: i64,
        baseline_usd: f64,
    ) -> Self {
        PyBudgetMeter {
            inner: Meter::new(
                usd,
                tokens,
                usd_text,
                tokens_text,
                span_kind,
                span_name,
                baseline_tokens,
                baseline_usd,
            ),
        }
    }

    /// Adds a model call's usage; returns the exceeded message, or `None`.
    #[pyo3(signature = (tokens, usd=None))]
    fn charge(&self, tokens: i64, usd: Option<f64>) -> Option<String> {
        self.inner.charge(tokens, usd)
    }

    /// `(tokens, usd)` spent so far, earlier attempts included.
    #[getter]
    fn spent(&self) -> (i64, f64) {
        self.inner.spent()
    }
}
