//! Budgets: spend caps checked after every model call in their subtree,
//! cumulative across attempts of a run (BUDGET-1 … BUDGET-9).

use parking_lot::Mutex;

/// One active budget: its caps, where it is attached, what earlier attempts
/// spent, and what this attempt has spent so far.
pub struct Meter {
    usd: Option<f64>,
    tokens: Option<i64>,
    /// The caps as the user wrote them (Python `str()`), for messages.
    usd_text: String,
    tokens_text: String,
    span_kind: String,
    span_name: String,
    spent: Mutex<Spend>,
}

#[derive(Default, Clone, Copy)]
struct Spend {
    tokens: i64,
    usd: f64,
}

impl Meter {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        usd: Option<f64>,
        tokens: Option<i64>,
        usd_text: String,
        tokens_text: String,
        span_kind: String,
        span_name: String,
        baseline_tokens: i64,
        baseline_usd: f64,
    ) -> Meter {
        Meter {
            usd,
            tokens,
            usd_text,
            tokens_text,
            span_kind,
            span_name,
            spent: Mutex::new(Spend {
                tokens: baseline_tokens,
                usd: baseline_usd,
            }),
        }
    }

    /// Adds one model call's usage (`usd` of an unpriced call counts as 0)
    /// and returns the `BudgetExceededError` message if a cap is now
    /// strictly exceeded; tokens are checked first (BUDGET-5, BUDGET-6).
    pub fn charge(&self, tokens: i64, usd: Option<f64>) -> Option<String> {
        let spent = {
            let mut s = self.spent.lock();
            s.tokens += tokens;
            s.usd += usd.unwrap_or(0.0);
            *s
        };
        let at = format!("budget exceeded on {} '{}'", self.span_kind, self.span_name);
        if self.tokens.is_some_and(|cap| spent.tokens > cap) {
            return Some(format!(
                "{at}: tokens budget={}, used={}",
                self.tokens_text, spent.tokens
            ));
        }
        if self.usd.is_some_and(|cap| spent.usd > cap) {
            return Some(format!(
                "{at}: usd budget={}, used=${:.4}",
                self.usd_text, spent.usd
            ));
        }
        None
    }

    /// `(tokens, usd)` spent, baseline included.
    pub fn spent(&self) -> (i64, f64) {
        let s = self.spent.lock();
        (s.tokens, s.usd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meter(usd: Option<f64>, tokens: Option<i64>, base: (i64, f64)) -> Meter {
        Meter::new(
            usd,
            tokens,
            usd.map(|u| u.to_string()).unwrap_or_default(),
            tokens.map(|t| t.to_string()).unwrap_or_default(),
            "agent".into(),
            "summarizer".into(),
            base.0,
            base.1,
        )
    }

    #[test]
    fn usd_cap_message_matches_the_spec_example() {
        let m = meter(Some(0.25), None, (0, 0.0));
        assert_eq!(m.charge(100, Some(0.2)), None);
        assert_eq!(
            m.charge(100, Some(0.112)).as_deref(),
            Some("budget exceeded on agent 'summarizer': usd budget=0.25, used=$0.3120")
        );
    }

    #[test]
    fn tokens_are_checked_first_and_only_strictly_greater_trips() {
        let m = meter(Some(0.01), Some(15), (10, 0.0));
        assert_eq!(m.charge(5, None), None);
        assert_eq!(
            m.charge(5, Some(1.0)).as_deref(),
            Some("budget exceeded on agent 'summarizer': tokens budget=15, used=20")
        );
    }

    #[test]
    fn unpriced_calls_are_invisible_to_usd_caps() {
        let m = meter(Some(0.0), None, (0, 0.0));
        assert_eq!(m.charge(1_000_000, None), None);
        assert_eq!(m.spent(), (1_000_000, 0.0));
    }
}
